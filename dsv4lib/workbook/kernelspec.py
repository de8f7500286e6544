"""The kernel metadata of this venv's notebooks, as JupyterLab compares it when a notebook opens (see :mod:`.lab`)."""
from __future__ import annotations

import sys

KERNEL_NAME = "python3"      # scripts/bootstrap.sh registers the venv's kernel under this name


def kernel_metadata() -> dict:
    """``kernelspec`` and ``language_info`` exactly as the venv's kernel reports them on connect: the display name
    bootstrap registered ("Python 3 (dsv4-workbook)"), ipykernel's ``language_info`` for this interpreter."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        display_name = KernelSpecManager().get_kernel_spec(KERNEL_NAME).display_name
    except NoSuchKernel:
        display_name = "Python 3 (ipykernel)"
    language_info = {        # ipykernel's IPythonKernel.language_info
        "name": "python", "version": sys.version.split()[0], "mimetype": "text/x-python",
        "codemirror_mode": {"name": "ipython", "version": sys.version_info[0]}, "pygments_lexer": "ipython3",
        "nbconvert_exporter": "python", "file_extension": ".py"}
    return {"kernelspec": {"display_name": display_name, "language": "python", "name": KERNEL_NAME},
            "language_info": language_info}

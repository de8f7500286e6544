"""The kernel metadata of this venv's notebooks, as JupyterLab compares it when a notebook opens (see :mod:`.lab`)."""
from __future__ import annotations

import copy
import functools

KERNEL_NAME = "python3"      # scripts/bootstrap.sh registers the venv's kernel under this name


@functools.lru_cache(maxsize=None)
def _kernel_metadata() -> dict:
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        display_name = KernelSpecManager().get_kernel_spec(KERNEL_NAME).display_name
    except NoSuchKernel:
        display_name = "Python 3 (ipykernel)"
    return {"kernelspec": {"display_name": display_name, "language": "python", "name": KERNEL_NAME},
            "language_info": dict(IPythonKernel.language_info)}


def kernel_metadata() -> dict:
    """``kernelspec`` and ``language_info`` exactly as the venv's kernel reports them on connect: the display name
    bootstrap registered ("Python 3 (dsv4-workbook)"), ipykernel's own ``language_info`` (this interpreter is the
    kernel's).  Looked up once per process (the lab server asks on every file it serves); a fresh copy each call."""
    return copy.deepcopy(_kernel_metadata())

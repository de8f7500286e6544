"""JupyterLab's file server for ``make lab``: jupytext's contents manager, plus the kernel metadata a stage notebook
leaves out.

The stage notebooks are jupytext ``.py`` files with no notebook metadata (``jupytext.toml`` filters it out of git).
JupyterLab writes ``language_info`` into a notebook when its kernel connects; a notebook served without it is then
*modified* the moment it opens (the unsaved-changes dot on a tab nobody edited — checked in Chromium: a plain
``.ipynb`` without ``language_info`` shows it too, one with the kernel's exact ``language_info`` does not).  So every
notebook served without kernel metadata gets this venv's: the ``python3`` kernel ``scripts/bootstrap.sh`` registers
("Python 3 (dsv4-workbook)") and the ``language_info`` that kernel reports (the same interpreter as this server).
Saving writes none of it back into the ``.py`` file (jupytext's metadata filter).

The pipeline gives the notebooks it executes the same metadata (:func:`.kernelspec.kernel_metadata`), so those open
unmodified too.  Used by ``make lab`` through ``--ServerApp.contents_manager_class=dsv4lib.workbook.lab.WorkbookContentsManager``.
"""
from __future__ import annotations

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

from .kernelspec import kernel_metadata


class WorkbookContentsManager(build_async_jupytext_contents_manager_class(AsyncLargeFileManager)):
    """Jupytext's manager (``.py`` stage notebooks open as notebooks) that fills in missing kernel metadata."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "notebook" and model.get("content") is not None:
            metadata = model["content"].metadata
            for key, value in kernel_metadata().items():
                metadata.setdefault(key, value)
        return model

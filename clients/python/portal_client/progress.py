"""The live line ``wait()`` shows: tqdm's, so it is one updating line in a terminal and a
live widget in a notebook (``tqdm.auto`` picks; plain text where widgets are missing)."""

from __future__ import annotations

import warnings
from typing import IO, Any

from tqdm import TqdmWarning  # type: ignore[import-untyped]

from portal_client.jobs import Job, status_line


class WaitProgress:
    """Shows ``status_line`` of each poll; ``close()`` leaves the last one standing."""

    def __init__(self, *, enabled: bool, file: IO[str] | None = None) -> None:
        self._bar: Any = None
        if enabled:
            with warnings.catch_warnings():
                # A kernel without ipywidgets gets the text line, documented, and no
                # "IProgress not found. Please update jupyter and ipywidgets" above it.
                warnings.simplefilter("ignore", TqdmWarning)
                from tqdm.auto import tqdm  # type: ignore[import-untyped]

            # A bar without a bar: the description is the whole line.
            self._bar = tqdm(total=None, bar_format="{desc}", file=file, leave=True)

    def show(self, job: Job, *, waited: float) -> None:
        if self._bar is not None:
            self._bar.set_description_str(status_line(job, waited=waited), refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

"""MkDocs hooks (mkdocs.yml `hooks:`) that keep the built site working when opened from disk.

Opened from disk (file://), Material's search does not fetch `search/search_index.json` (a browser
refuses fetch() there) but loads `search/search_index.js` as a script, which the search plugin
does not write: every page then logged a failed load and an uncaught error. This writes it.
Material's own `offline` plugin writes the same file, but also adds a script from unpkg.com to
every page, a network load a page opened offline cannot make.

Searching itself still needs a web worker, which a browser does not start from a file: opened
from disk the search box stays at "Initializing search"; served (`scripts/docs.sh`) it works.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def on_post_build(config: Any, **_: Any) -> None:
    index = Path(config["site_dir"]) / "search" / "search_index.json"
    if index.is_file():
        index.with_suffix(".js").write_text("var __index = " + index.read_text(encoding="utf-8"),
                                            encoding="utf-8")

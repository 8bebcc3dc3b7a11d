from __future__ import annotations

from esiwrap.cli import main

raise SystemExit(main())

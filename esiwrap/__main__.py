from __future__ import annotations

from esiwrap.shell import early

early.catch()  # before the imports below: signal-ready at once (see esiwrap._console)

from esiwrap.cli import main  # noqa: E402

raise SystemExit(main())

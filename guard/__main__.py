from __future__ import annotations

from guard.cli import main

raise SystemExit(main())

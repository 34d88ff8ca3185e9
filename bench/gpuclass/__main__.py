"""python -m bench.gpuclass [--help]: the GPUClass benchmark alone."""

from __future__ import annotations

from bench.gpuclass import main

raise SystemExit(main())

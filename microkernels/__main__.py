"""`python -m microkernels ...`: the command line lives in `benchmarks`, above every layer."""

from benchmarks.cli import main

raise SystemExit(main())

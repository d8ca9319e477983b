from ragsidecar.cli import main

raise SystemExit(main())

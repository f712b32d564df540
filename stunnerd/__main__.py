from stunnerd.cli import main

raise SystemExit(main())

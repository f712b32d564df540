from stunnerd.launch import main

raise SystemExit(main())

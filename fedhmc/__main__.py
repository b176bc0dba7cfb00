import sys

from fedhmc.cli.main import main

sys.exit(main())

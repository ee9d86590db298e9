import sys

from cfl.app.cli import main

sys.exit(main())

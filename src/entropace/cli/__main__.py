import sys

from entropace.cli import main

sys.exit(main())

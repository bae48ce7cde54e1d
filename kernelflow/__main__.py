import sys

from kernelflow.cli import main

sys.exit(main())

import sys

from kernelflow.cli.main import main

sys.exit(main())

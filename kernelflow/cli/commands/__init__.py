"""The ``kernelflow`` subcommands, one module per group; each adds its subcommands to the
parser with ``register(subparsers)`` and runs them with its ``cmd_*`` functions, called
as ``cmd_x(args, settings)`` and returning the exit code."""

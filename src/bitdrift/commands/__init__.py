"""The core's ``bitdrift`` subcommands, grouped in modules as the studies' are: each module
holds its commands' handlers and, in ``add_commands(subparsers)``, their parsers. Handlers
import what they need when they run, so a command pays only for its own imports."""

# make the data, analyse it, explain it, draw it (`bitdrift --help` groups their commands
# by what a user is doing: bitdrift.cli.HELP_GROUPS)
MODULES = ("run", "tables", "kernels", "repro", "figures", "atlas", "published",
           "emulation")

"""The command line: ``kernelflow`` (main), its commands, the report's plots and HTML, and
the web dashboard (docs/architecture.md, "Rooms of the kernelflow package"). Nothing
outside this room imports it."""

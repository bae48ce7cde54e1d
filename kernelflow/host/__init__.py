"""The host: what runs kernelflow on a machine and connects a process to it — settings,
the embedded NATS server and its keys, the client runtime (connecting, in-process
daemons, waiting for tasks), health, observability and the exits of a command
(docs/architecture.md, "Rooms of the kernelflow package"). It imports the layers and
nothing of the library APIs or the CLI."""

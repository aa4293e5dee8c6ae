"""The user-facing entry points, above the compiler: Dynamo capture (`backend="vfuse"`), ahead-of-time
compilation through torch.export (`vfuse.compile`), and tracing a callable to ATen or to IR."""

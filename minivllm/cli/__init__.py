"""The command line, ``python -m minivllm [group=option ...] [key=value ...]``: the top of the
package graph. It composes the config and runs its task (generate, bench or serve)."""

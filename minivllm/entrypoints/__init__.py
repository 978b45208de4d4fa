"""Front ends: the offline LLM class and the CLI (the HTTP server lives in serve/)."""

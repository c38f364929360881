"""The engine behind HTTP: its own loop, token streams, the OpenAI API, live metrics, a load generator."""

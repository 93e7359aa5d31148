"""Model calls: the client with retries and accounting, its transports, several endpoints, the local llama.cpp model."""

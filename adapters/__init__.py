"""Engines behind one interface: vLLM, TGI, TensorRT-LLM, any OpenAI server, and the reference."""

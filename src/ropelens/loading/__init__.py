"""Loading models: embedded GGUF models, HF directories and hub ids, vision-language models."""

"""The OpenAI HTTP protocol: pydantic request/response models and their conversion to the
engine contract. Pydantic lives only here and in the config schema (the edges)."""

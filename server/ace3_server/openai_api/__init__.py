"""The OpenAI-compatible fine-tuning API under ``/openai/v1``: files and fine-tuning jobs shaped
so that the official ``openai`` package works unchanged against ACE3, authenticated with an ACE3
API key (docs/language-models.md). Left out of ACE3's OpenAPI document: ``openai`` is its
client, not the ACE3 SDK."""

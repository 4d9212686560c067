"""Statistics shared by the local and the SGLang bench: a bench set's bootstrap intervals over its prompts."""

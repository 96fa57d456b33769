"""Structured output: grammars compiled through xgrammar, masks and jump-forward."""

"""Mixtral, OLMoE and other models without tool or reasoning markup: text only."""
from .base import Parser


class PlainParser(Parser):
    pass

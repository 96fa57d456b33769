"""Chat formats between the API and the engine: templates, tool-call and reasoning parsers.

Nothing here imports the engine; the engine and the server import these.
"""

from radixserve.chat.templates import ChatFormat, ChatTemplating

__all__ = ["ChatFormat", "ChatTemplating"]

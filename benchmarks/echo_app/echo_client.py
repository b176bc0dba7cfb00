"""The echo ClientApp: replies with what it was sent (no torch, no computation)."""

from flwr.app import Message
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def query(msg: Message, context) -> Message:
    return Message(msg.content, reply_to=msg)


@app.train()
def train(msg: Message, context) -> Message:
    return Message(msg.content, reply_to=msg)

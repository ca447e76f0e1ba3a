"""Helpers shared by the tests that build models: a module's weights by layer, GPT-2's byte symbols."""

import numpy as np

from topometrics.models.architectures import module_layers, oriented


def module_weights(model) -> dict[str, np.ndarray]:
    """``{block{i}.{part}: (out, in) float32 array}`` of an in-memory model, in layer order: the reference the
    streamed weights and the monitor's snapshots are checked against."""
    layers = module_layers(model)
    return {layer.name: oriented(model.get_parameter(layer.tensor).detach(), layer.transposed) for layer in layers}


def gpt2_byte_symbols() -> dict[str, int]:
    """The ByteLevel alphabet written out independently (GPT-2's ``bytes_to_unicode``): symbol -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    symbols = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(shifted)}
    assert len(symbols) == 256
    return symbols

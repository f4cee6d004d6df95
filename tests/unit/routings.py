"""Routing choices as the tests read them: (name, settings) and the canonical label."""

from fabriclab.apps.choice import Routing


def parsed(choice):
    """(name, {option: value}) of a routing choice, parsed once into a Routing."""
    routing = Routing.parse(choice)
    return routing.name, dict(routing.settings)


def label_of(choice):
    return Routing.parse(choice).label

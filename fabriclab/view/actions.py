"""What the web view's buttons ask the lab to do. Each request is checked as hostile input (known
actions and keys only, numbers finite and in range, names that exist), then carried out through
the same lab API the prompt calls, so it lands in the same fault log; the lab's own refusals
come back as one line.

    {"action": "link_down", "link": "l1-s1"}          link ids as the page draws them
    {"action": "link_up", "link": "h1-n0-l1"}
    {"action": "degrade", "link": "l1-s1#2", "rate_mbps": 2}
    {"action": "restore_rate", "link": "l1-s1"}
    {"action": "loss", "link": "l1-s1", "fraction": 0.01}       0 ends it
    {"action": "switch_down", "switch": "s1"}  /  {"action": "switch_up", "switch": "s1"}
    {"action": "buffer", "switch": "s1", "fraction": 0.5}      1 gives the whole buffer back
    {"action": "latency", "switch": "s1", "us": 2}  /  {"action": "latency", "link": "l1-s1", "us": 2}   0 ends it
    {"action": "timeline_start", "faults": "- {at: 0, link_down: l1-s1, for: 2}"}
    {"action": "timeline_stop"}  /  {"action": "restore"}
"""

from __future__ import annotations

import time

from fabriclab.errors import LabError
from fabriclab.loading import excerpt, fields, number, parse_yaml
from fabriclab.view.layout import link_id

MAX_TIMELINE_CHARS = 32_768
# action -> (its keys besides "action", the required ones)
ACTIONS = {
    "link_down": (("link",), ("link",)),
    "link_up": (("link",), ("link",)),
    "degrade": (("link", "rate_mbps"), ("link", "rate_mbps")),
    "restore_rate": (("link",), ("link",)),
    "loss": (("link", "fraction"), ("link", "fraction")),
    "switch_down": (("switch",), ("switch",)),
    "switch_up": (("switch",), ("switch",)),
    "buffer": (("switch", "fraction"), ("switch", "fraction")),
    "latency": (("switch", "link", "us"), ("us",)),
    "timeline_start": (("faults",), ("faults",)),
    "timeline_stop": ((), ()),
    "restore": ((), ()),
}


def _link(lab, value):
    if not isinstance(value, str):
        raise LabError(f"link must be a link's name, got {excerpt(value)}")
    for link in lab.fabric.links:
        if link_id(link) == value:
            return link
    raise LabError(f"no link {excerpt(value)} in fabric {excerpt(lab.fabric.spec.name)}")


def _switch(lab, value):
    if not isinstance(value, str) or value not in lab.fabric.switches:
        raise LabError(f"no switch {excerpt(value)} in fabric {excerpt(lab.fabric.spec.name)}")
    return value


def check(lab, request):
    """(action, its arguments resolved) for a request dict; LabError in one line otherwise."""
    if not isinstance(request, dict) or not isinstance(request.get("action"), str):
        raise LabError(f"a request is {{\"action\": one of {', '.join(ACTIONS)}, ...}}")
    action = request["action"]
    if action not in ACTIONS:
        raise LabError(f"unknown action {excerpt(action)} (known: {', '.join(ACTIONS)})")
    known, required = ACTIONS[action]
    fields(request, action, ("action",) + known, required)
    args = {}
    if action == "latency" and ("link" in request) == ("switch" in request):
        raise LabError("latency takes one of switch or link")
    if "link" in known and (action != "latency" or "link" in request):
        args["link"] = _link(lab, request["link"])
    if "switch" in known and (action != "latency" or "switch" in request):
        args["switch"] = _switch(lab, request["switch"])
    if action == "degrade":
        rate = number(request["rate_mbps"], "degrade rate_mbps", 0, 1e6, low_open=True)
        if rate >= args["link"].rate_mbps:
            raise LabError(f"degrade rate_mbps {rate:g} is not below the link's {args['link'].rate_mbps:g} Mbit/s")
        args["rate"] = rate
    if action == "loss":
        args["fraction"] = number(request["fraction"], "loss fraction", 0, 0.999999)
    if action == "buffer":
        args["fraction"] = number(request["fraction"], "buffer fraction", 0, 1, low_open=True)
    if action == "latency":
        args["us"] = number(request["us"], "latency us", 0, 1e6)
    if action == "timeline_start":
        text = request["faults"]
        if not isinstance(text, str) or len(text) > MAX_TIMELINE_CHARS:
            raise LabError(f"faults must be the text of a `faults:` list, at most {MAX_TIMELINE_CHARS} characters")
        data = parse_yaml(text, "timeline")
        args["entries"] = data.get("faults") if isinstance(data, dict) and set(data) == {"faults"} else data
    return action, args


def perform(lab, session, request):
    """Carry out a request; returns what happened, in one line."""
    action, args = check(lab, request)
    t0 = time.monotonic()
    link = args.get("link")
    if action in ("link_down", "link_up"):
        lab.set_links([link], action == "link_up", what=link.label)
        return f"{link_id(link)} {action[5:]}; controller reprogrammed in {time.monotonic() - t0:.2f} s"
    if action in ("switch_down", "switch_up"):
        cables = lab.set_switch(args["switch"], action == "switch_up")
        return (f"{args['switch']} {action[7:]} ({len(cables)} cables); controller reprogrammed in "
                f"{time.monotonic() - t0:.2f} s")
    if action == "buffer":
        ports = lab.cut_buffer(args["switch"], args["fraction"])
        return (f"{args['switch']}: {len(ports)} ports " + ("with their whole buffer" if args["fraction"] == 1 else
                                                           f"tail-drop past {args['fraction']:g} of their buffer"))
    if action == "latency":
        what = args.get("switch") or link_id(link)
        ports = lab.set_latency(args.get("switch") or [link], args["us"])
        return f"{what}: {len(ports)} ports " + (f"{args['us']:g} us (real) slower" if args["us"] else
                                                 "at the spec's delay")
    if action == "degrade":
        lab.reshape_links([link], args["rate"])
        return f"{link_id(link)} shaped to {args['rate']:g} Mbit/s (it stays up)"
    if action == "restore_rate":
        lab.reshape_links([link], None)
        return f"{link_id(link)} back to its spec rate, {link.rate_mbps:g} Mbit/s"
    if action == "loss":
        lab.set_loss([link], args["fraction"])
        return (f"{link_id(link)}: " + (f"{args['fraction']:.3%} of packets lost each way" if args["fraction"]
                                        else "no loss"))
    if action == "timeline_start":
        steps = session.inject(args["entries"])
        return f"{len(steps)} fault step(s) over {steps[-1].t if steps else 0:g} s started"
    if action == "timeline_stop":
        return "fault timeline stopped" if session.stop_timeline() else "no fault timeline is running"
    lab.restore()
    return "every link up, at its spec rate and without loss"

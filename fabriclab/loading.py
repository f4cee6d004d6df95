"""The one way the lab reads a file a user hands it (specs, scenarios, fault files, profiles,
results): every input is treated as hostile.

- Bounded: a regular file only (not /dev/zero, a FIFO or a directory), at most `limit` bytes, read
  no further than that; strict UTF-8.
- YAML: nesting at most MAX_DEPTH deep and at most MAX_NODES values with aliases expanded (a
  "billion laughs" file is refused before anything walks it), duplicate keys refused, booleans only
  as `true`/`false` (YAML 1.1's yes/no/on/off stay strings, so a field that wants a boolean refuses
  them), no NaN or infinity anywhere, no integer longer than MAX_INT_DIGITS, and no control
  character (C0 but tab and line ends, DEL, C1) or lone surrogate in any key or string, written
  raw or as an escape: a NUL in a name would end it early in the kernel or a C library, an ESC
  rewrites the terminal that prints it, and a lone surrogate cannot be written out as UTF-8.
- JSON: the same depth, duplicate-key and finite-number rules; lone surrogates (`"\\ud800"`)
  refused, as nothing can write them back out. Other escaped controls stay: the lab's own
  documents may record a program's output.
- Messages quote a short excerpt of a value (`excerpt`), never the value.

Field checks that need a schema (unknown keys, physical ranges) stay with each loader; `fields`,
`number`, `whole` and `boolean` are the shared pieces they use.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
import stat
import zlib

import yaml

from fabriclab.errors import LabError

MAX_TEXT_BYTES = 1 << 20            # a spec, scenario or profile: hand-written, a few KiB
MAX_DEPTH = 32
MAX_NODES = 100_000
# No field holds a number this long (2**64 has 20 digits); Python refuses to convert past 4300
# digits, and a message would otherwise quote them all.
MAX_INT_DIGITS = 40
# What no key or string of an input may hold: C0 controls but tab, LF and CR; DEL; C1 controls
# (NEL too: a line break YAML 1.1 reads inside a value); lone surrogates.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# In JSON text (strict UTF-8) a lone surrogate can only be an escape: only then walk the data
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# What YAML refuses in a file's raw text (PyYAML's Reader.NON_PRINTABLE)
_UNPRINTABLE = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlevel = 40, 40, 2
_short.maxdict = _short.maxlist = _short.maxtuple = _short.maxset = 4


def excerpt(value, limit=60):
    """A short, bounded repr of any value for an error message (safe on huge or shared values)."""
    text = _short.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def clip(text, limit=80):
    """A string cut to `limit` characters for a message (paths, parser problems)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def is_file(path):
    """Whether `path` names something to open (False for names no file can have: a NUL byte,
    over-long)."""
    try:
        return os.path.exists(path)
    except (OSError, ValueError):
        return False


def read_text(path, what="file", limit=MAX_TEXT_BYTES, error=LabError, gzipped=False):
    """The text of a regular file of at most `limit` bytes, or `error` in one line. `gzipped`: a
    gzip-compressed file (found by its magic bytes) is read as the text it unpacks to, also at
    most `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except ValueError:
        raise error(f"cannot read {what} {clip(path)}: not a file name") from None
    except OSError as exc:
        raise error(f"cannot read {what} {clip(path)}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise error(f"{what} {clip(path)} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise error(f"cannot read {what} {clip(path)}: {exc.strerror}") from None
    if len(data) > limit:
        raise error(f"{what} {clip(path)} is larger than {_size(limit)}")
    if gzipped and data[:2] == GZIP_MAGIC:
        data = _gunzip(data, limit, f"{what} {clip(path)}", error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {clip(path)} is not UTF-8 text (byte {exc.start})") from None


GZIP_MAGIC = b"\x1f\x8b"


def _gunzip(data, limit, where, error):
    """What gzip `data` unpacks to (every member), never more than `limit` bytes held."""
    out = bytearray()
    while data:
        unpack = zlib.decompressobj(wbits=31)
        try:
            out += unpack.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise error(f"{where} is not a valid gzip file ({clip(exc, 60)})") from None
        if len(out) > limit or unpack.unconsumed_tail:
            raise error(f"{where} unpacks to more than {_size(limit)}")
        if not unpack.eof:
            raise error(f"{where} is a truncated gzip file")
        data = unpack.unused_data
    return bytes(out)


def _size(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


try:        # libyaml's scanner and parser: the pure-Python ones take 5 s over a 600 KB file
    from yaml._yaml import CParser as _CParser
except ImportError:                                  # PyYAML built without libyaml
    _CParser = None

if _CParser is not None:
    class _Base(yaml.composer.Composer, _CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """SafeLoader with libyaml's events under PyYAML's own composer (Composer comes first:
        CParser's C composer would bypass the limits below) and constructor."""

        def __init__(self, stream):
            _CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
else:
    _Base = yaml.SafeLoader


class _Loader(_Base):
    """SafeLoader with limits: depth and node count while composing, expanded size before
    constructing, duplicate keys and non-finite numbers refused, YAML 1.2 booleans."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0                # composed, aliases not expanded (_expanded_size does that)

    def compose_node(self, parent, index):
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep (line {mark.line + 1})")
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} values (line {self.peek_event().start_mark.line + 1})")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise _Refused(f"a key that is not a plain value (line {key_node.start_mark.line + 1})")
            if duplicate:
                raise _Refused(f"key {excerpt(key)} appears twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        digits = node.value.replace("_", "").lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise _Refused(f"line {node.start_mark.line + 1}: a {len(digits)}-digit number "
                           f"({clip(node.value, 24)}) is larger than any field takes")
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise _Refused(f"{excerpt(node.value)} is not a finite number (line {node.start_mark.line + 1})")
        return value


_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
# Only true/false are booleans (YAML 1.2); the implicit resolvers are per class, so copy first.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


class _Refused(Exception):
    pass


def _expanded_size(node, memo, depth=0):
    """How many values `node` stands for with every alias expanded (memoized: linear in the
    file)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = MAX_NODES + 1          # a node that contains itself counts as too many
    if isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(item, memo) for item in node.value)
    else:
        size = 1
    memo[key] = min(size, MAX_NODES + 1)
    return memo[key]


def _control_name(char):
    code = ord(char)
    if code == 0:
        return "a NUL character (U+0000)"
    if 0xD800 <= code <= 0xDFFF:
        return f"a lone surrogate (U+{code:04X})"
    return f"control character U+{code:04X}"


def _check_printable(text):
    """`_Refused` naming the line, the field and an excerpt where `text` holds a character YAML
    refuses in a file (a NUL byte, another control character, DEL)."""
    found = _UNPRINTABLE.search(text)
    if found is None:
        return
    start = text.rfind("\n", 0, found.start()) + 1
    end = text.find("\n", found.start())
    line = text[start:end if end >= 0 else len(text)]
    key = re.match(r"\s*(?:-\s+)?([^\s:#\x00-\x1f\x7f-\x9f][^:#\x00-\x1f\x7f-\x9f]*?)\s*:(?:\s|$)", line)
    field = f", field {excerpt(key.group(1), 30)}" if key else ""
    raise _Refused(f"line {text.count(chr(10), 0, found.start()) + 1}{field}: {_control_name(found.group())} "
                   f"in {excerpt(line, 40)}; YAML files cannot hold it")


def _path_text(path):
    """A key path as a person writes it: jobs[0].hosts[1]."""
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{clip(p, 30)}" for p in path)
    return clip(text.lstrip("."), 80) or "the document"


def _strings(data, pattern):
    """(path, string) of the first key or string in `data` that `pattern` finds in, or None;
    iterative, and each shared (aliased) container once."""
    seen, stack = set(), [((), data)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if pattern.search(item):
                return path, item
        elif isinstance(item, (dict, list)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, dict):
                for key, value in item.items():
                    if isinstance(key, str) and pattern.search(key):
                        return path, key
                    stack.append((path + (key if isinstance(key, (str, int)) else excerpt(key, 20),), value))
            else:
                stack.extend((path + (i,), value) for i, value in enumerate(item))
    return None


def _refuse_controls(data, pattern):
    found = _strings(data, pattern)
    if found is not None:
        path, text = found
        char = pattern.search(text).group()
        raise _Refused(f"{_path_text(path)}: {_control_name(char)} in {excerpt(text, 40)}")


def parse_yaml(text, where, error=LabError):
    """The data in YAML `text`, within the limits above; `error` naming `where` and the line."""
    try:
        _check_printable(text)
        loader = _Loader(text)
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:              # what the reader refuses that the scan above missed
        raise error(f"{where}: is not valid YAML: {clip(getattr(exc, 'reason', None) or exc)}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} values once its aliases are expanded")
        data = loader.construct_document(node)
        _refuse_controls(data, _CONTROL)
        return data
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed"
        raise error(f"{where}:{line} is not valid YAML: {clip(problem)}") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply") from None
    finally:
        loader.dispose()


def load_yaml(path, what, limit=MAX_TEXT_BYTES, error=LabError):
    """`read_text` then `parse_yaml`: the data of a YAML file a user named."""
    return parse_yaml(read_text(path, what, limit, error), clip(path), error)


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = next(k for i, k in enumerate(keys) if k in keys[:i])
        raise _Refused(f"key {excerpt(twice)} appears twice")
    return dict(pairs)


def _no_constant(name):
    raise _Refused(f"{name} is not a finite number")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{excerpt(text)} is not a finite number")
    return value


def parse_json(text, where, error=LabError):
    """The data in JSON `text`: duplicate keys, NaN/Infinity and deep nesting refused."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                          parse_float=_finite_float)
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except ValueError as exc:
        raise error(f"{where}: not valid JSON ({clip(exc)})") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply") from None
    if _depth(data) > MAX_DEPTH:
        raise error(f"{where}: nested more than {MAX_DEPTH} levels deep")
    try:
        if _SURROGATE_ESCAPE.search(text):
            _refuse_controls(data, _SURROGATE)
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    return data


def _depth(data):
    """How deeply `data` nests (iteratively: no recursion on hostile input)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack += [(v, level + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, level + 1) for v in item]
    return deepest


def fields(data, where, known, required=(), error=LabError):
    """`data` as a mapping with only `known` keys (and every `required` one); one line otherwise."""
    if not isinstance(data, dict):
        raise error(f"{where}: must be a mapping ({', '.join(known)}), got {excerpt(data)}")
    for key in data:
        if key not in known:
            raise error(f"{where}: unknown key {excerpt(key)} (known: {', '.join(known)})")
    for key in required:
        if key not in data:
            raise error(f"{where}: missing {key}")
    return data


def number(value, where, low=None, high=None, *, low_open=False, error=LabError):
    """A finite int or float in [low, high] (or (low, high] with low_open); never a boolean."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{where} must be a number, got {excerpt(value)}")
    if not math.isfinite(value):
        raise error(f"{where} must be a finite number, got {excerpt(value)}")
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value > high):
        if low is not None and high is not None:
            span = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        else:
            span = f"{'>' if low_open else '>='} {low:g}" if below else f"<= {high:g}"
        raise error(f"{where} must be {span}, got {excerpt(value)}")
    return value


def whole(value, where, low=None, high=None, error=LabError):
    """A whole number (int, not bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{where} must be a whole number, got {excerpt(value)}")
    return number(value, where, low, high, error=error)


def boolean(value, where, error=LabError):
    """`true` or `false` only: 'no', 0 and 'maybe' are refused, not read as true or false."""
    if not isinstance(value, bool):
        raise error(f"{where} must be true or false, got {excerpt(value)}")
    return value

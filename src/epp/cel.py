"""CEL over a ``usage`` map: celpy parses and checks; common expressions run as compiled closures.

A leaf: it imports nothing of the EPP (an import-linter contract in pyproject.toml fails
the build if it ever does); the plugin that uses it is
``epp.director.reporters.attribute_reporter``, which passes the usage counts in as plain
numbers.

celpy (cel-python) is the reference: it parses every expression, and it evaluates any
expression outside the subset below.  Its tree-walking interpreter costs 150-650 µs per
evaluation, too much for a hook that runs once per request on the event loop, so the
expressions people write for cost reporting (field access on ``usage``, ``has()``,
literals, arithmetic, comparisons, ``&&``/``||``/``!``, ``?:``, ``in``, and calls of
CEL's standard functions such as ``int()``) are compiled once into a tree of Python
closures.  Each closure does what celpy's ``Evaluator`` method for the same grammar rule
does, with celpy's own operator functions and value types, so both paths give the same
value or the same error for every input (tests/test_cel.py checks it on
hypothesis-generated expressions against celpy's own ``Runner``).  Nothing is ever passed
to Python's ``eval``/``exec``.

Importing this module imports celpy (about half a second), so plugins import it lazily.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator
from typing import Any, Final

import celpy
import lark
from celpy import celtypes, evaluation
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, Evaluator, base_functions, boolean

USAGE: Final = "usage"

UsageValue = celtypes.MapType  # the CEL ``usage`` variable
Node = lark.Tree[Any]

# Result of an evaluation: a CEL value, or an Exception instance when evaluation failed
# (celpy's CELEvalError, or whatever celpy raised).  Errors are values, never raised, so a
# failing expression costs no traceback on the request path.
Evaluate = Callable[[celtypes.MapType], Any]

_MACROS: Final = frozenset({"map", "filter", "all", "exists", "exists_one"})
# Rules that only wrap a single child when no operator is present.
_WRAPPERS: Final = frozenset(
    {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member"}
)
_RELATIONS: Final = {
    "relation_lt": "_<_",
    "relation_le": "_<=_",
    "relation_ge": "_>=_",
    "relation_gt": "_>_",
    "relation_eq": "_==_",
    "relation_ne": "_!=_",
    "relation_in": "_in_",
}
# celpy's comparison functions rebuild a functools.wraps wrapper on every call
# (``bool_lt(a, b)`` is ``boolean(operator.lt)(a, b)``); build each wrapper once, for as
# long as celpy's table still holds those functions.
_PREBUILT: Final[dict[str, Callable[..., Any]]] = {
    op: boolean(compare)
    for op, name, compare in (
        ("_<_", "bool_lt", operator.lt),
        ("_<=_", "bool_le", operator.le),
        ("_>=_", "bool_ge", operator.ge),
        ("_>_", "bool_gt", operator.gt),
        ("_==_", "bool_eq", operator.eq),
        ("_!=_", "bool_ne", operator.ne),
    )
    if base_functions.get(op) is getattr(evaluation, name, None)
}
_ADDITIONS: Final = {"addition_add": "_+_", "addition_sub": "_-_"}
_MULTIPLICATIONS: Final = {
    "multiplication_mul": "_*_",
    "multiplication_div": "_/_",
    "multiplication_mod": "_%_",
}
_UNARIES: Final = {"unary_not": "!_", "unary_neg": "-_"}
# Exceptions celpy's Evaluator turns into error values, per rule; any other exception
# escapes the whole evaluation (and is then an error value of ``CelProgram.evaluate``).
_RELATION_ERRORS: Final = (TypeError,)
_ADDITION_ERRORS: Final = (TypeError, ValueError, OverflowError)
_MULTIPLICATION_ERRORS: Final = (TypeError, ZeroDivisionError, ValueError, OverflowError)
_UNARY_ERRORS: Final = (TypeError, ValueError)
_CALL_ERRORS: Final = (TypeError, AttributeError, ValueError)

_KEY_PROMPT: Final = celtypes.StringType("prompt_tokens")
_KEY_COMPLETION: Final = celtypes.StringType("completion_tokens")
_KEY_TOTAL: Final = celtypes.StringType("total_tokens")
_KEY_DETAILS: Final = celtypes.StringType("prompt_token_details")
_KEY_CACHED: Final = celtypes.StringType("cached_tokens")


class CelCompileError(ValueError):
    """The expression cannot be compiled; the message says where and why."""


class _Unsupported(Exception):
    """The expression is outside the compiled subset: celpy's interpreter evaluates it."""


def usage_value(
    prompt_tokens: int, completion_tokens: int, total_tokens: int, cached_tokens: int | None = None
) -> celtypes.MapType:
    """The CEL ``usage`` variable, shaped as GIE's ``google.protobuf.Struct`` of the Go Usage.

    Struct numbers are doubles, so every count is a ``double``; ``prompt_token_details``
    exists only when the server reported cached tokens (``cached_tokens`` is not None).
    """
    double = celtypes.DoubleType
    m = celtypes.MapType()
    m[_KEY_PROMPT] = double(prompt_tokens)
    m[_KEY_COMPLETION] = double(completion_tokens)
    m[_KEY_TOTAL] = double(total_tokens)
    if cached_tokens is not None:
        details = celtypes.MapType()
        details[_KEY_CACHED] = double(cached_tokens)
        m[_KEY_DETAILS] = details
    return m


def is_true(result: object) -> bool:
    """Whether a condition's result is CEL ``true`` (errors and non-booleans are not)."""
    return isinstance(result, celtypes.BoolType | bool) and bool(result)


_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def as_int64(result: object) -> int | None:
    """GIE's conversion of an expression result: an int or a double becomes an int64.

    Doubles truncate toward zero, as Go's ``int64(f)``; NaN, infinities and values out
    of int64 range give None, as do booleans, unsigned ints (Go's ``uint64`` is neither
    ``int64`` nor ``float64``), strings, maps and errors.
    """
    if isinstance(result, bool | celtypes.BoolType | celtypes.UintType):
        return None
    if isinstance(result, int):
        n = int(result)
    elif isinstance(result, float):
        if not math.isfinite(result):
            return None
        n = int(result)
    else:
        return None
    return n if _INT64_MIN <= n <= _INT64_MAX else None


class CelProgram:
    """One CEL expression over the single variable ``usage``, compiled once.

    ``evaluate`` never raises: it returns the CEL value, or an ``Exception`` instance
    when the expression fails for that input (a missing field, a type mismatch ...).
    ``compiled`` tells whether the fast closure path is used; ``fast=False`` forces
    celpy's interpreter (the reference the closures are tested against).
    """

    __slots__ = ("_fast", "_runner", "source")

    def __init__(self, source: str, *, fast: bool = True) -> None:
        self.source = source
        env = celpy.Environment()
        try:
            ast = env.compile(source)
        except CELParseError as e:
            raise CelCompileError(f"syntax error at line {e.line}, column {e.column} of {source!r}") from None
        _check(ast)
        self._runner = env.program(ast)
        self._fast: Evaluate | None = None
        if fast:
            try:
                self._fast = _Compiler(self._runner).compile(ast)
            except _Unsupported:
                self._fast = None

    @property
    def compiled(self) -> bool:
        return self._fast is not None

    def evaluate(self, usage: celtypes.MapType) -> Any:
        try:
            fast = self._fast
            if fast is not None:
                return fast(usage)
            return self._runner.evaluate({USAGE: usage})
        except Exception as e:  # why: celpy reports failures as several exception types
            return e

    def __repr__(self) -> str:
        return f"CelProgram({self.source!r}, compiled={self.compiled})"


# --- checking: what cel-go's type checker rejects at compile time -------------------------


def _unwrap(node: Node) -> Node:
    """The first node under ``node`` that is more than a one-child wrapper (``primary`` included)."""
    while (node.data in _WRAPPERS or node.data == "primary") and len(node.children) == 1:
        child = node.children[0]
        if not isinstance(child, lark.Tree):
            break
        node = child
    return node


def _args(node: Node, index: int) -> list[Node]:
    """The argument trees of the ``exprlist`` at ``node.children[index]`` (none if absent)."""
    if len(node.children) <= index:
        return []
    exprlist = node.children[index]
    if not isinstance(exprlist, lark.Tree):
        return []
    return [c for c in exprlist.children if isinstance(c, lark.Tree)]


def _call_parts(node: Node) -> tuple[str, list[Node]]:
    """Name and argument trees of an ``ident_arg``/``dot_ident_arg`` call."""
    return str(node.children[0]), _args(node, 1)


def _subtrees(tree: Node) -> Iterator[Node]:
    """Every subtree of ``tree``, itself included (the order does not matter to the checks)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in node.children if isinstance(c, lark.Tree))


def _check(ast: Node) -> None:
    """Reject what cel-go rejects when compiling against ``usage`` alone.

    Undeclared variables (a typo such as ``usgae.completion_tokens``), unknown functions,
    ``has()`` on anything but a field selection, and message construction fail at
    startup instead of failing every request.  Type errors between literals are left to
    evaluation, where they make the result "not written".
    """
    bound: set[str] = set()  # variables introduced by macros: [..].map(x, x * 2)
    for node in _subtrees(ast):
        if node.data == "member_dot_arg":
            args = _args(node, 2)
            if str(node.children[1]) in _MACROS and args:
                var = _unwrap(args[0])
                if var.data == "ident":
                    bound.add(str(var.children[0]))
    known = {USAGE, *base_functions, *bound}
    for node in _subtrees(ast):
        data = node.data
        if data in ("ident", "dot_ident"):
            name = str(node.children[0])
            if name not in known:
                raise CelCompileError(f"undeclared reference to '{name}'")
        elif data in ("ident_arg", "dot_ident_arg"):
            name, args = _call_parts(node)
            if name == "has":
                if len(args) != 1 or _unwrap(args[0]).data != "member_dot":
                    raise CelCompileError("invalid argument to has() macro")
            elif name != "dyn" and name not in base_functions:
                raise CelCompileError(f"undeclared reference to '{name}'")
        elif data == "member_dot_arg":
            method = str(node.children[1])
            if method not in _MACROS and method not in base_functions:
                raise CelCompileError(f"undeclared reference to '{method}'")
        elif data == "member_object":
            raise CelCompileError("message construction is not supported")


# --- compiling: one closure per grammar rule, mirroring celpy's Evaluator -----------------


class _Compiler:
    """Turns a celpy parse tree into closures; raises ``_Unsupported`` outside the subset."""

    def __init__(self, runner: celpy.Runner) -> None:
        self._runner = runner

    def compile(self, node: Node | lark.Token) -> Evaluate:
        if not isinstance(node, lark.Tree):
            raise _Unsupported(repr(node))
        rule = getattr(self, f"_{node.data}", None)
        if rule is None:
            raise _Unsupported(node.data)
        result: Evaluate = rule(node)
        return result

    def _single(self, node: Node) -> Evaluate:
        return self.compile(node.children[0])

    def _expr(self, node: Node) -> Evaluate:
        if len(node.children) == 1:
            return self._single(node)
        if len(node.children) != 3:
            raise _Unsupported("expr")
        cond, if_true, if_false = (self.compile(c) for c in node.children)
        choose = base_functions["_?_:_"]
        false = celtypes.BoolType(False)

        def conditional(u: celtypes.MapType) -> Any:
            c = cond(u)
            left = right = false
            try:
                if c:
                    left = if_true(u)
                else:
                    right = if_false(u)
                return choose(c, left, right)
            except TypeError as ex:
                return CELEvalError("found no matching overload for _?_:_", ex.__class__, ex.args)

        return conditional

    def _logical(self, node: Node, op: str) -> Evaluate:
        if len(node.children) == 1:
            return self._single(node)
        if len(node.children) != 2:
            raise _Unsupported(node.data)
        left_f, right_f = (self.compile(c) for c in node.children)
        func = base_functions[op]

        def logical(u: celtypes.MapType) -> Any:
            left = left_f(u)
            right = right_f(u)
            try:
                return func(left, right)
            except TypeError as ex:
                return CELEvalError(f"found no matching overload for {op}", ex.__class__, ex.args)

        return logical

    def _conditionalor(self, node: Node) -> Evaluate:
        return self._logical(node, "_||_")

    def _conditionaland(self, node: Node) -> Evaluate:
        return self._logical(node, "_&&_")

    def _binary(self, node: Node, ops: dict[str, str], errors: tuple[type[Exception], ...]) -> Evaluate:
        if len(node.children) == 1:
            return self._single(node)
        op_tree, right_tree = node.children
        if not isinstance(op_tree, lark.Tree) or op_tree.data not in ops or len(op_tree.children) != 1:
            raise _Unsupported(node.data)
        op = ops[op_tree.data]
        func = _PREBUILT.get(op) or base_functions[op]
        left_f = self.compile(op_tree.children[0])
        right_f = self.compile(right_tree)

        def binary(u: celtypes.MapType) -> Any:
            left = left_f(u)
            right = right_f(u)
            try:
                return func(left, right)
            except errors as ex:
                return CELEvalError(f"{op} failed", ex.__class__, ex.args)

        return binary

    def _relation(self, node: Node) -> Evaluate:
        return self._binary(node, _RELATIONS, _RELATION_ERRORS)

    def _addition(self, node: Node) -> Evaluate:
        return self._binary(node, _ADDITIONS, _ADDITION_ERRORS)

    def _multiplication(self, node: Node) -> Evaluate:
        return self._binary(node, _MULTIPLICATIONS, _MULTIPLICATION_ERRORS)

    def _unary(self, node: Node) -> Evaluate:
        if len(node.children) == 1:
            return self._single(node)
        op_tree, operand_tree = node.children
        if not isinstance(op_tree, lark.Tree) or op_tree.data not in _UNARIES:
            raise _Unsupported("unary")
        op = _UNARIES[op_tree.data]
        func = base_functions[op]
        operand = self.compile(operand_tree)

        def unary(u: celtypes.MapType) -> Any:
            right = operand(u)
            try:
                return func(right)
            except _UNARY_ERRORS as ex:
                return CELEvalError(f"{op} failed", ex.__class__, ex.args)

        return unary

    def _member(self, node: Node) -> Evaluate:
        if len(node.children) != 1:
            raise _Unsupported("member")
        return self._single(node)

    def _member_dot(self, node: Node) -> Evaluate:
        member_tree, name_token = node.children
        member_f = self.compile(member_tree)
        name = str(name_token)
        message_type, map_type = celtypes.MessageType, celtypes.MapType

        def member_dot(u: celtypes.MapType) -> Any:
            m = member_f(u)
            if isinstance(m, CELEvalError):
                return m
            if isinstance(m, message_type):
                return m.get(name)
            if isinstance(m, map_type):
                try:
                    return m[name]
                except KeyError:
                    return CELEvalError(f"no such member in mapping: {name!r}", KeyError, None)
            return CELEvalError(f"{type(m)} does not support field selection", TypeError, None)

        return member_dot

    def _primary(self, node: Node) -> Evaluate:
        if len(node.children) != 1:
            raise _Unsupported("primary")
        child = node.children[0]
        if not isinstance(child, lark.Tree):
            raise _Unsupported("primary")
        kind = child.data
        if kind == "literal":
            return self._literal(child)
        if kind == "paren_expr":
            return self._single(child)
        if kind == "ident" and str(child.children[0]) == USAGE:
            return _identity
        if kind == "ident_arg":
            return self._call(child)
        raise _Unsupported(kind)

    def _literal(self, node: Node) -> Evaluate:
        try:
            value = Evaluator(ast=node, activation=self._runner.new_activation()).visit(node)
        except Exception as e:  # why: a literal celpy cannot build is left to celpy at run time
            raise _Unsupported("literal") from e

        def literal(u: celtypes.MapType) -> Any:
            return value

        return literal

    def _call(self, node: Node) -> Evaluate:
        name, args = _call_parts(node)
        arg_fs = [self.compile(a) for a in args]
        if name == "has":
            (arg_f,) = arg_fs  # _check allows exactly one field selection
            bool_type = celtypes.BoolType

            def has(u: celtypes.MapType) -> Any:
                return bool_type(not isinstance(arg_f(u), CELEvalError))

            return has
        if name == "dyn":
            if len(arg_fs) != 1:
                raise _Unsupported("dyn")
            return arg_fs[0]
        func = base_functions.get(name)
        if func is None:
            raise _Unsupported(name)

        def call(u: celtypes.MapType) -> Any:
            values = [f(u) for f in arg_fs]
            for v in values:
                if isinstance(v, CELEvalError):
                    return v
            try:
                return func(*values)
            except _CALL_ERRORS as ex:
                return CELEvalError(f"{name}() failed", ex.__class__, ex.args)

        return call


def _identity(u: celtypes.MapType) -> Any:
    return u

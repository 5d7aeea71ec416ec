"""Recursive-descent parser: tokens to a tuple-based syntax tree.

Grammar (lowest precedence first):
    expr    := term (("+" | "-") term)*
    term    := unary (("*" | "/" | "//" | "%") unary)*
    unary   := ("+" | "-") unary | power
    power   := atom ("**" unary)?
    atom    := number | name | name "(" args ")" | "(" expr ")"
"""

from exprcalc.tokenizer import CalcError, tokenize


class _Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.index = 0

    def peek(self):
        return self.tokens[self.index]

    def take(self, kind=None, text=None):
        token = self.peek()
        if (kind and token.kind != kind) or (text and token.text != text):
            wanted = text or kind
            found = token.text or "end of input"
            raise CalcError(f"expected {wanted!r} at position {token.pos}, found {found!r}")
        self.index += 1
        return token

    def at(self, kind, *texts):
        token = self.peek()
        return token.kind == kind and (not texts or token.text in texts)

    def expr(self):
        node = self.term()
        while self.at("op", "+", "-"):
            op = self.take().text
            node = (op, node, self.term())
        return node

    def term(self):
        node = self.unary()
        while self.at("op", "*", "/", "//", "%"):
            op = self.take().text
            node = (op, node, self.unary())
        return node

    def unary(self):
        if self.at("op", "+", "-"):
            op = self.take().text
            return ("neg" if op == "-" else "pos", self.unary())
        return self.power()

    def power(self):
        node = self.atom()
        if self.at("op", "**"):
            self.take()
            node = ("**", node, self.unary())
        return node

    def atom(self):
        token = self.peek()
        if token.kind == "number":
            self.take()
            value = float(token.text)
            return ("num", int(value) if value.is_integer() and not any(c in token.text for c in ".eE") else value)
        if token.kind == "name":
            self.take()
            if self.at("lparen"):
                self.take()
                args = []
                if not self.at("rparen"):
                    args.append(self.expr())
                    while self.at("comma"):
                        self.take()
                        args.append(self.expr())
                self.take("rparen")
                return ("call", token.text, tuple(args))
            return ("var", token.text)
        if token.kind == "lparen":
            self.take()
            node = self.expr()
            self.take("rparen")
            return node
        found = token.text or "end of input"
        raise CalcError(f"unexpected {found!r} at position {token.pos}")


def parse(text):
    """Parse an expression into a syntax tree of tuples."""
    parser = _Parser(tokenize(text))
    node = parser.expr()
    parser.take("end")
    return node

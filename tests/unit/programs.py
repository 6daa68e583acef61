"""DSL text of one-kernel programs for the checker's tests: a body of decisions under the
arch (and impl) line of each family."""


def sm80(body: str) -> str:
    return f"kernel k {{\n arch sm80\n {body}\n}}"


def sm90(body: str) -> str:
    return f"kernel k {{\n arch sm90a\n {body}\n}}"


def l2gen(body: str) -> str:
    return f"kernel k {{\n arch sm90a impl l2gen\n {body}\n}}"

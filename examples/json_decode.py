"""Structured output: JSON built field by field with regex-constrained gens, and a whole object
constrained by a JSON schema. Needs a server with constrained decoding (the default xgrammar).

    radixlm serve --port 30000
    python examples/json_decode.py --url http://127.0.0.1:30000
"""

import argparse
import json

import radixlm.lang as rl
from radixlm.lang.ir import REGEX_STR

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "population": {"type": "integer"},
                   "country": {"type": "string", "maxLength": 20}},
    "required": ["name", "population", "country"],
}


@rl.function
def city_by_fields(s, city):
    s += rl.user(f"Give information about {city} in JSON.")
    with s.assistant():
        with s.var_scope("json"):
            s += '{\n  "name": ' + rl.gen("name", regex=REGEX_STR, max_tokens=10) + ",\n"
            s += '  "population": ' + rl.gen_int("population", max_tokens=10) + "\n}"


@rl.function
def city_by_schema(s, city):
    s += rl.user(f"Give information about {city} in JSON with name, population and country.")
    s += rl.assistant(rl.gen("json", json_schema=SCHEMA, max_tokens=64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    args = parser.parse_args()

    rl.set_default_backend(rl.RuntimeEndpoint(args.url))
    for program in (city_by_fields, city_by_schema):
        state = program.run(city="Paris", temperature=0, raise_on_error=True)
        obj = json.loads(state["json"])
        print(f"{program.__name__}: {obj}")


if __name__ == "__main__":
    main()

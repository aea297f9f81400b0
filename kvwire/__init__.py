"""kvwire: the facts a replica and a gateway must agree on, defined once.

Metric names (``metric_names``), the KV-event wire format (``kv_event_format``), the block
hash chain (``block_hashing``), the tokenizer and chat rendering (``tokenizer``,
``chat_messages``), the OpenAI request fields and error body (``openai_schema``) and the
HTTP request edge both servers put in front of their handlers (``request_edge``), and how
both read a secret given inline, in a file or in an environment variable
(``secret_source``).

Dependency rule (``tests/test_layers.py`` reads every import and enforces it)::

    gateway   -> policies -> kvwire
    engine    -> kvwire
    loadtests -> gateway, policies, engine, kvwire
    kvgate    -> kvwire (``kvgate.layout``, the prefix checks users import); its command
                 line loads the others' subcommands by name

kvwire imports none of the project's other packages; policies import neither gateway nor
engine; engine imports neither gateway nor policies.
"""

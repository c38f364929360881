"""minillm: how one GPU serves a crowd of LLM users, small enough to read.

    model/     the tiny transformer, its tokenizer and its files
    engine/    THE CORE: requests, the two scheduling policies, the block allocator, the KV caches,
               packing a step, running it, the loop, and the one-user decode loop it must match
    training/  the synthetic tasks and how the model learns them
    card/      a real model on a real card: datasheets, config.json, the roofline, a simulated clock
    runs/      workloads in; the engine run over them; metrics out
    serving/   the engine behind an OpenAI-compatible HTTP server, and a load generator
    bench/     every claim of the lessons, measured
Imports run one way: model <- engine <- (training, card) <- runs <- (serving, bench) <- the CLI.
"""

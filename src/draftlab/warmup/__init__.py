"""Compiles built ahead in processes of their own while generate and extract run: launch.py starts and awaits them,
compile.py builds the train stage's unroll graphs, decode.py the generate stage's decode step."""

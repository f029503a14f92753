"""The ingest engine: producer log lines become CommitLog records.

``message`` declares what a parsed message is; ``lines`` parses one line (the reference route),
``blocks`` parses a block of lines column-wise to the same result; ``files`` finds and reads input;
``scratch`` writes a task's intermediate files atomically; ``plan`` assigns queues and places records;
``tasks`` is what runs on executors. ``steps.ingest`` drives them.
"""

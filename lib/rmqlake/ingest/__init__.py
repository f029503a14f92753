"""The ingest engine: producer log lines become CommitLog records.

``message`` declares what a parsed message is; ``lines`` parses one line (the reference route),
``blocks`` parses a block of lines column-wise to the same result and ``parse`` joins the two;
``files`` finds and reads input; ``scratch`` names a run's intermediate files and writes them
atomically; ``plan`` assigns queues and places records; ``tasks`` is what runs on executors.
``steps.ingest`` drives them.
"""

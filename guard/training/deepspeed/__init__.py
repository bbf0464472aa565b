"""DeepSpeed ZeRO checkpoints (stages 1, 2 and 3; bf16 and fp16): ``save_dir/latest`` and ``save_dir/<tag>/``.

``files`` reads one ``*_model_states.pt`` / ``*_optim_states.pt`` (the torch zip checks, DeepSpeed's inert
classes allow-listed, nothing unpickled); ``records`` turns the walked pickles into plain records;
``partitions`` places every parameter's fp32 master in the ranks' flat partitions, as ``zero_to_fp32``
does, and checks they add up; ``dirs`` claims a tag directory and reads it into a ``TrainingState``;
``source`` hands the masters to ``convert``.
"""

"""The code exercises import and the learner reads but does not write: each function once, named after its idea.

    hbm            the simulated GPU memory of exercises 05 and 08, and the row blocks they walk
    tiles          pointers to a tile of rows, its masked load, the head-dim padding (the Triton exercises)
    inputs         the Triton wrappers' input checks
    launch         compiled or interpreted, the grid, fixed tiles or autotuned ones
    precision      tl.dot's input precision for float32, as torch's matmuls: TF32 only where asked
    solved         an exercise as solved in solutions/, for the later ones that build on it
    block_mask     FlexAttention's block-mask layout: which tiles are computed, and which masked (12, 13)
    masks          13's masks as @triton.jit functions, and the block mask built from one on the device
    sparse_launch  13's autograd wrapper, its kernels' tiles and grid
    dropout_launch 14's autograd wrapper, its dropout_p and seed checks, its kernels' tiles and grid
    gpt            15's model around the learner's attention layer: GPT-2's blocks at a small size
    needle         15's data, made by code: documents that hide a needle, the long-range task
    train          15's training loop: AdamW, progress every few steps, Ctrl-C between steps
"""

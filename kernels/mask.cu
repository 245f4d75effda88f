// A right-side filter's predicate, a row per thread: the machine of `MaskProgram` (see
// src/join/mask_program.rs, whose `evaluate_on_host` is this loop in Rust and whose `op` codes
// these are). Each value is a 64-bit key and a NULL flag; a row passes where the program leaves
// one TRUE. The answer is a bit a row, a warp's 32 rows a word.

#define MASK_STACK 16
#define MASK_LOAD 0
#define MASK_CONST 1
#define MASK_NULL 2
#define MASK_ADD 3
#define MASK_SUB 4
#define MASK_MUL 5
#define MASK_DIV 6
#define MASK_REM 7
#define MASK_EQ 8
#define MASK_NE 9
#define MASK_LT 10
#define MASK_LE 11
#define MASK_GT 12
#define MASK_GE 13
#define MASK_AND 14
#define MASK_OR 15
#define MASK_NOT 16
#define MASK_IS_NULL 17
#define MASK_IS_NOT_NULL 18

extern "C" __global__ void __launch_bounds__(256) mask_program(const MaskArgs a) {
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    bool pass = false;
    if (row < a.rows) {
        long long value[MASK_STACK];
        bool null[MASK_STACK];
        int top = 0;
        for (int i = 0; i < a.n_ops; ++i) {
            const long long code = a.ops[2 * i];
            const long long operand = a.ops[2 * i + 1];
            if (code == MASK_LOAD) {
                value[top] = a.values[operand][row];
                const u32* valid = a.valid[operand];
                null[top] = valid != 0 && ((valid[row >> 5] >> (row & 31)) & 1u) == 0;
                ++top;
            } else if (code == MASK_CONST || code == MASK_NULL) {
                value[top] = operand;
                null[top] = code == MASK_NULL;
                ++top;
            } else if (code == MASK_DIV) {
                value[top - 1] /= operand;
            } else if (code == MASK_REM) {
                value[top - 1] %= operand;
            } else if (code == MASK_NOT) {
                value[top - 1] = value[top - 1] == 0;
            } else if (code == MASK_IS_NULL || code == MASK_IS_NOT_NULL) {
                value[top - 1] = null[top - 1] == (code == MASK_IS_NULL);
                null[top - 1] = false;
            } else {
                --top;
                const long long x = value[top - 1], y = value[top];
                const bool xn = null[top - 1], yn = null[top];
                long long v;
                bool n = xn || yn;
                if (code == MASK_AND) {
                    const bool false_either = (!xn && x == 0) || (!yn && y == 0);
                    v = !false_either;
                    n = !false_either && (xn || yn);
                } else if (code == MASK_OR) {
                    const bool true_either = (!xn && x != 0) || (!yn && y != 0);
                    v = true_either;
                    n = !true_either && (xn || yn);
                } else if (code == MASK_ADD) {
                    // (unsigned: the wrap of two's complement, defined)
                    v = (long long)((unsigned long long)x + (unsigned long long)y);
                } else if (code == MASK_SUB) {
                    v = (long long)((unsigned long long)x - (unsigned long long)y);
                } else if (code == MASK_MUL) {
                    v = (long long)((unsigned long long)x * (unsigned long long)y);
                } else if (code == MASK_EQ) {
                    v = x == y;
                } else if (code == MASK_NE) {
                    v = x != y;
                } else if (code == MASK_LT) {
                    v = x < y;
                } else if (code == MASK_LE) {
                    v = x <= y;
                } else if (code == MASK_GT) {
                    v = x > y;
                } else {
                    v = x >= y;
                }
                value[top - 1] = v;
                null[top - 1] = n;
            }
        }
        pass = top == 1 && !null[0] && value[0] != 0;
    }
    // Every lane of the warp votes (the rows past the end as failing), lane 0 writes the word.
    const u32 word = __ballot_sync(0xffffffffu, pass);
    if ((threadIdx.x & 31) == 0 && row < a.rows) {
        a.words[row >> 5] = word;
    }
}

#!/usr/bin/env python3
"""Generates the evaluation trajectories (eval/trajectories/*.json).

Run: python3 eval/trajectories/gen.py
Deterministic: the same source gives byte-identical JSON (sorted keys, 2-space
indent; think_ms from a log-normal seeded by the trajectory name).
See README.md for the format and hack/check-trajectories.py for validation.
"""
import hashlib
import json
import math
import os
import random
import sys
import textwrap

OUT = os.path.dirname(os.path.abspath(__file__))
IMAGE = "docker.io/crab/python:latest"
REGISTRY = []


def D(s):
    """Dedented file content / multi-line command."""
    return textwrap.dedent(s).lstrip("\n")


def think_times(name, n):
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        v = rng.lognormvariate(math.log(3000), 0.6)
        out.append(int(round(min(10000, max(1000, v)))))
    return out


def wait_port(port):
    return D(f"""
        python3 -c "
        import socket, time
        for i in range(100):
            try:
                socket.create_connection(('127.0.0.1', {port}), 0.2).close(); print('up'); break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit('server not up')
        "
        """).rstrip()


def wait_sock(path):
    return D(f"""
        python3 -c "
        import socket, time
        for i in range(100):
            try:
                s = socket.socket(socket.AF_UNIX); s.connect('{path}'); s.close(); print('up'); break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit('daemon not up')
        "
        """).rstrip()


class Traj:
    def __init__(self, name, title, category):
        self.name, self.title, self.category = name, title, category
        self.workdir = "/sandbox/" + name
        self.turns = []
        self.verify = None
        self.paths = [self.workdir]
        self.volatile = []
        self.probe = None
        self.ro = []

    def sh(self, command, ro=False):
        """A shell turn; ro=True marks it read-only (for the README statistics)."""
        self.turns.append({"tool": "shell", "command": D(command).rstrip("\n")})
        self.ro.append(ro)
        return self

    def r(self, command):
        """A read-only shell turn (inspects, changes nothing)."""
        return self.sh(command, ro=True)

    def write(self, path, content, mode=None):
        t = {"tool": "write_file", "path": path, "content": D(content)}
        if mode:
            t["mode"] = mode
        self.turns.append(t)
        self.ro.append(False)
        return self

    def doc(self):
        times = think_times(self.name, len(self.turns))
        turns = []
        for t, ms in zip(self.turns, times):
            t = dict(t)
            t["think_ms"] = ms
            turns.append(t)
        state = {"paths": self.paths, "volatile": self.volatile}
        if self.probe:
            state["probe"] = self.probe
        return {
            "format": 1,
            "name": self.name,
            "title": self.title,
            "category": self.category,
            "image": IMAGE,
            "workdir": self.workdir,
            "turns": turns,
            "verify": D(self.verify).rstrip("\n") + "\n",
            "state": state,
        }


def traj(fn):
    REGISTRY.append(fn)
    return fn




# ====================================================================== build
@traj
def c_calc():
    t = Traj("c-calc", "Build a small C calculator with make and tcc", "build")
    t.r("pwd && ls -la")
    t.r("which tcc make && tcc -v")
    t.write("calc.h", r"""
        #ifndef CALC_H
        #define CALC_H
        long calc_apply(long a, char op, long b, int *err);
        #endif
        """)
    t.write("calc.c", r"""
        #include "calc.h"

        long calc_apply(long a, char op, long b, int *err)
        {
            *err = 0;
            switch (op) {
            case '+': return a + b;
            case '-': return a - b;
            case 'x': return a * b;
            case '/':
                if (b == 0) { *err = 1; return 0; }
                return a / b
            default:
                *err = 2;
                return 0;
            }
        }
        """)
    t.write("main.c", r"""
        #include <stdio.h>
        #include <stdlib.h>
        #include "calc.h"

        int main(int argc, char **argv)
        {
            int err;
            long r;
            if (argc != 4) {
                fprintf(stderr, "usage: calc A OP B\n");
                return 2;
            }
            r = calc_apply(atol(argv[1]), argv[2][0], atol(argv[3]), &err);
            if (err == 1) { fprintf(stderr, "division by zero\n"); return 1; }
            if (err == 2) { fprintf(stderr, "unknown operator %s\n", argv[2]); return 1; }
            printf("%ld\n", r);
            return 0;
        }
        """)
    t.write("Makefile", """
        CC = tcc
        CFLAGS = -Wall -O2

        calc: main.o calc.o
        \t$(CC) $(CFLAGS) -o $@ main.o calc.o

        %.o: %.c calc.h
        \t$(CC) $(CFLAGS) -c -o $@ $<

        clean:
        \trm -f calc *.o

        .PHONY: clean
        """)
    t.sh('make; echo "exit=$?"')
    t.r("grep -n 'return a / b' calc.c")
    t.sh("sed -i 's|return a / b$|return a / b;|' calc.c && sed -n '10,16p' calc.c")
    t.sh("make")
    t.r("./calc 2 + 3; ./calc 7 / 2; ./calc 6 x 7")
    t.r('./calc 1 / 0; echo "exit=$?"; ./calc 1 % 2; echo "exit=$?"')
    t.write("test.sh", r"""
        #!/bin/sh
        # usage: ./test.sh  -- runs the calculator against expected outputs
        fail=0
        check() {
            want="$1"; shift
            got=$(./calc "$@" 2>&1)
            if [ "$got" = "$want" ]; then echo "ok   $* = $got"; else echo "FAIL $*: got '$got' want '$want'"; fail=1; fi
        }
        check 5 2 + 3
        check -1 2 - 3
        check 42 6 x 7
        check 3 7 / 2
        check "division by zero" 1 / 0
        exit $fail
        """, mode="0755")
    t.sh("./test.sh")
    t.r("cat Makefile")
    t.write("Makefile", """
        CC = tcc
        CFLAGS = -Wall -O2

        calc: main.o calc.o
        \t$(CC) $(CFLAGS) -o $@ main.o calc.o

        %.o: %.c calc.h
        \t$(CC) $(CFLAGS) -c -o $@ $<

        test: calc
        \t./test.sh

        clean:
        \trm -f calc *.o

        .PHONY: clean test
        """)
    t.sh("make test")
    # add modulo and power
    t.sh(r"""sed -i "s|    case 'x': return a \* b;|    case 'x': return a * b;\n    case '%': if (b == 0) { *err = 1; return 0; } return a % b;|" calc.c && cat calc.c""")
    t.sh("make && ./calc 17 % 5")
    t.write("pow.c", r"""
        #include "calc.h"

        long calc_pow(long a, long b)
        {
            long r = 1;
            while (b-- > 0)
                r *= a;
            return r;
        }
        """)
    t.sh(r"""sed -i 's|long calc_apply(long a, char op, long b, int \*err);|&\nlong calc_pow(long a, long b);|' calc.h && cat calc.h""")
    t.sh(r"""sed -i "s|    default:|    case '^': return calc_pow(a, b);\n    default:|" calc.c && grep -n "case" calc.c""")
    t.sh("make; echo \"exit=$?\"")
    t.r("grep -n 'calc:' Makefile")
    t.sh(r"""sed -i 's|^calc: main.o calc.o$|calc: main.o calc.o pow.o|; s|-o $@ main.o calc.o$|-o $@ main.o calc.o pow.o|' Makefile && cat Makefile""")
    t.sh("make && ./calc 2 ^ 10")
    t.sh(r"""sed -i -e '/^exit \$fail/i check 2 17 % 5' -e '/^exit \$fail/i check 1024 2 ^ 10' -e '/^exit \$fail/i check 1 9 ^ 0' test.sh && tail -6 test.sh""")
    t.sh("make test")
    t.r("ls -la && wc -l *.c *.h")
    t.sh("make clean && make 2>&1 | tail -n 3 && ./test.sh | tail -n 3")
    t.write("README.md", """
        # calc

        Tiny integer calculator: `./calc A OP B` with OP one of `+ - x / % ^`.
        Build with `make`, test with `make test`.
        """)
    t.r("./calc 100 - 58 && ./calc 3 ^ 4")
    t.verify = r"""
        set -e
        test -x calc
        ./calc 2 + 3 | grep -qx 5
        ./calc 17 % 5 | grep -qx 2
        ./calc 2 ^ 10 | grep -qx 1024
        make -s test >/dev/null
        ! ./calc 1 / 0 2>/dev/null
        """
    return t


@traj
def c_strlib():
    t = Traj("c-strlib", "Tiny C string library with unit tests run by make test", "build")
    t.r("ls -la; tcc -v; make --version | head -1")
    t.sh("mkdir -p src include tests && ls")
    t.write("include/strutil.h", r"""
        #ifndef STRUTIL_H
        #define STRUTIL_H
        #include <stddef.h>

        char *su_trim(char *s);
        char *su_reverse(char *s);
        size_t su_count(const char *s, char c);
        int su_starts_with(const char *s, const char *prefix);
        #endif
        """)
    t.write("src/strutil.c", r"""
        #include <string.h>
        #include <ctype.h>
        #include "strutil.h"

        char *su_trim(char *s)
        {
            char *end;
            while (isspace((unsigned char)*s))
                s++;
            end = s + strlen(s);
            while (end > s && isspace((unsigned char)end[-1]))
                end--;
            *end = '\0';
            return s;
        }

        char *su_reverse(char *s)
        {
            size_t i, n = strlen(s);
            for (i = 0; i < n / 2; i++) {
                char c = s[i];
                s[i] = s[n - i];
                s[n - i] = c;
            }
            return s;
        }

        size_t su_count(const char *s, char c)
        {
            size_t n = 0;
            for (; *s; s++)
                if (*s == c)
                    n++;
            return n;
        }

        int su_starts_with(const char *s, const char *prefix)
        {
            return strncmp(s, prefix, strlen(prefix)) == 0;
        }
        """)
    t.write("tests/test_strutil.c", r"""
        #include <stdio.h>
        #include <string.h>
        #include "strutil.h"

        static int failures, checks;

        #define CHECK(cond) do { checks++; if (!(cond)) { failures++; \
            printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } } while (0)

        int main(void)
        {
            char a[] = "  hello world \t\n";
            char b[] = "abcde";
            char c[] = "ab";
            CHECK(strcmp(su_trim(a), "hello world") == 0);
            CHECK(strcmp(su_reverse(b), "edcba") == 0);
            CHECK(strcmp(su_reverse(c), "ba") == 0);
            CHECK(su_count("banana", 'a') == 3);
            CHECK(su_count("", 'a') == 0);
            CHECK(su_starts_with("crabshell", "crab"));
            CHECK(!su_starts_with("crab", "crabshell"));
            printf("%d checks, %d failures\n", checks, failures);
            return failures != 0;
        }
        """)
    t.write("Makefile", """
        CC = tcc
        CFLAGS = -Wall -Iinclude
        OBJS = build/strutil.o

        all: build/libstrutil.a

        build/%.o: src/%.c include/strutil.h
        \t@mkdir -p build
        \t$(CC) $(CFLAGS) -c -o $@ $<

        build/libstrutil.a: $(OBJS)
        \t$(CC) -ar rcs $@ $(OBJS)

        build/test_strutil: tests/test_strutil.c build/libstrutil.a
        \t$(CC) $(CFLAGS) -o $@ tests/test_strutil.c build/libstrutil.a

        test: build/test_strutil
        \t./build/test_strutil

        clean:
        \trm -rf build

        .PHONY: all test clean
        """)
    t.sh("make")
    t.r("ls -la build")
    t.sh('make test; echo "exit=$?"')
    t.r("sed -n '/su_reverse/,/^}/p' src/strutil.c")
    t.sh(r"""sed -i 's/s\[i\] = s\[n - i\];/s[i] = s[n - 1 - i];/; s/s\[n - i\] = c;/s[n - 1 - i] = c;/' src/strutil.c && sed -n '/su_reverse/,/^}/p' src/strutil.c""")
    t.sh("make test")
    t.r("grep -n 'su_' include/strutil.h")
    t.sh(r"""sed -i 's|^int su_starts_with(const char \*s, const char \*prefix);|&\nint su_ends_with(const char *s, const char *suffix);\nchar *su_upper(char *s);|' include/strutil.h && cat include/strutil.h""")
    t.write("src/strutil2.c", r"""
        #include <string.h>
        #include <ctype.h>
        #include "strutil.h"

        int su_ends_with(const char *s, const char *suffix)
        {
            size_t n = strlen(s), m = strlen(suffix);
            return m <= n && memcmp(s + n - m, suffix, m) == 0;
        }

        char *su_upper(char *s)
        {
            char *p;
            for (p = s; *p; p++)
                *p = toupper((unsigned char)*p);
            return s;
        }
        """)
    t.sh("sed -i 's|^OBJS = build/strutil.o$|OBJS = build/strutil.o build/strutil2.o|' Makefile && grep -n OBJS Makefile")
    t.write("tests/test_more.c", r"""
        #include <stdio.h>
        #include <string.h>
        #include "strutil.h"

        int main(void)
        {
            char s[] = "Crab Shell 42";
            int bad = 0;
            bad |= !su_ends_with("checkpoint.img", ".img");
            bad |= su_ends_with("img", "checkpoint.img");
            bad |= strcmp(su_upper(s), "CRAB SHELL 42") != 0;
            printf("test_more: %s\n", bad ? "FAIL" : "ok");
            return bad;
        }
        """)
    t.write("Makefile", """
        CC = tcc
        CFLAGS = -Wall -Iinclude
        OBJS = build/strutil.o build/strutil2.o
        TESTS = build/test_strutil build/test_more

        all: build/libstrutil.a

        build/%.o: src/%.c include/strutil.h
        \t@mkdir -p build
        \t$(CC) $(CFLAGS) -c -o $@ $<

        build/libstrutil.a: $(OBJS)
        \trm -f $@
        \t$(CC) -ar rcs $@ $(OBJS)

        build/test_%: tests/test_%.c build/libstrutil.a
        \t$(CC) $(CFLAGS) -o $@ $< build/libstrutil.a

        test: $(TESTS)
        \t@for t in $(TESTS); do ./$$t || exit 1; done

        clean:
        \trm -rf build

        .PHONY: all test clean
        """)
    t.sh('make test; echo "exit=$?"')
    t.r("ls -la build && od -c build/libstrutil.a | head -3")
    t.sh("make clean && make test 2>&1 | tail -n 4")
    t.write("tests/test_trim.c", r"""
        #include <stdio.h>
        #include <string.h>
        #include "strutil.h"

        int main(void)
        {
            char empty[] = "";
            char spaces[] = "    ";
            char inner[] = " a  b ";
            int bad = 0;
            bad |= strcmp(su_trim(empty), "") != 0;
            bad |= strcmp(su_trim(spaces), "") != 0;
            bad |= strcmp(su_trim(inner), "a  b") != 0;
            bad |= su_count("a,b,,c", ',') != 3;
            printf("test_trim: %s\n", bad ? "FAIL" : "ok");
            return bad;
        }
        """)
    t.sh("sed -i 's|^TESTS = build/test_strutil build/test_more$|TESTS = build/test_strutil build/test_more build/test_trim|' Makefile && make test")
    t.r("grep -c CHECK tests/test_strutil.c; wc -l src/*.c tests/*.c")
    t.sh("make -q test; echo \"up-to-date=$?\"")
    t.r("git --version; ls -R | head -30")
    t.write("README", """
        strutil - tiny string helpers (trim, reverse, count, starts/ends_with, upper)

        make        builds build/libstrutil.a
        make test   builds and runs tests/test_*.c
        """)
    t.verify = r"""
        set -e
        test -f build/libstrutil.a
        make -s test | grep -q '7 checks, 0 failures'
        make -s test | grep -q 'test_more: ok'
        make -s test | grep -q 'test_trim: ok'
        grep -q 'n - 1 - i' src/strutil.c
        """
    t.volatile = ["build/*.a"]
    return t


WF_C_V1 = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>

#define MAXW 64

struct entry { char word[MAXW]; int count; struct entry *next; };

static struct entry *table[4096];
static int nwords;

static unsigned hash(const char *s)
{
    unsigned h = 5381;
    while (*s)
        h = h * 33 + (unsigned char)*s++;
    return h % 4096;
}

static void add(const char *w)
{
    unsigned h = hash(w);
    struct entry *e;
    for (e = table[h]; e; e = e->next)
        if (strcmp(e->word, w) == 0) { e->count++; return; }
    e = calloc(1, sizeof *e);
    strncpy(e->word, w, MAXW - 1);
    e->count = 1;
    e->next = table[h];
    table[h] = e;
    nwords++;
}

static int cmp(const void *a, const void *b)
{
    const struct entry *x = *(const struct entry **)a, *y = *(const struct entry **)b;
    if (x->count != y->count)
        return y->count - x->count;
    return strcmp(x->word, y->word);
}

int main(int argc, char **argv)
{
    char w[MAXW];
    int c, n = 0, i, k, limit = 10;
    struct entry **all, *e;
    if (argc > 1)
        limit = atoi(argv[1]);
    while ((c = getchar()) != EOF) {
        if (isalpha(c)) {
            if (n < MAXW - 1)
                w[n++] = c;
        } else if (n) {
            w[n] = 0; add(w); n = 0;
        }
    }
    if (n) { w[n] = 0; add(w); }
    all = malloc(sizeof *all * (nwords + 1));
    for (i = 0, k = 0; i < 4096; i++)
        for (e = table[i]; e; e = e->next)
            all[k++] = e;
    qsort(all, k, sizeof *all, cmp);
    for (i = 0; i < k && i < limit; i++)
        printf("%7d %s\n", all[i]->count, all[i]->word);
    return 0;
}
"""

CORPUS = {
    "texts/crab.txt": """
        The crab walks sideways. The crab hides in the sand.
        A crab has ten legs; the crab molts its shell when it grows.
        Hermit crabs borrow a shell, and the hermit crab moves house often.
        """,
    "texts/sandbox.txt": """
        A sandbox runs untrusted code. The sandbox is cheap to start,
        cheap to checkpoint, and cheap to restore. Restore the sandbox
        after a crash and the agent continues as if nothing happened.
        """,
    "texts/mixed.txt": """
        Checkpoint checkpoint CHECKPOINT. Restore, restore; RESTORE!
        it's the agent's job: plan, act, observe, plan, act, observe.
        """,
}


@traj
def c_wordfreq():
    t = Traj("c-wordfreq", "Word-frequency text tool in C: options, tests, install", "build")
    t.r("ls -la")
    t.r("tcc -v && make -v | head -n 1")
    t.sh("mkdir -p texts tests")
    for p, c in CORPUS.items():
        t.write(p, c)
    t.r("wc -w texts/*.txt")
    t.write("wf.c", WF_C_V1)
    t.write("Makefile", """
        CC = tcc
        CFLAGS = -Wall -O2
        PREFIX = ./dist

        wf: wf.c
        \t$(CC) $(CFLAGS) -o $@ wf.c

        clean:
        \trm -f wf
        .PHONY: clean
        """)
    t.sh("make")
    for p in CORPUS:
        t.r(f"./wf 5 < {p}")
    t.r("cat texts/*.txt | ./wf 8")
    t.r("./wf 3 < texts/mixed.txt; grep -o -i checkpoint texts/mixed.txt | sort | uniq -c")
    # case folding option
    t.r("grep -n 'isalpha' wf.c")
    t.sh(r"""sed -i 's/                w\[n++\] = c;/                w[n++] = fold ? tolower(c) : c;/' wf.c && grep -n 'w\[n++\]' wf.c""")
    t.sh(r"""sed -i 's/    int c, n = 0, i, k, limit = 10;/    int c, n = 0, i, k, limit = 10, fold = 0;/' wf.c && grep -n 'fold' wf.c""")
    t.r("sed -n '/^int main/,/^    while/p' wf.c")
    t.write("args.patch", r"""
        --- wf.c
        +++ wf.c
        @@ -52,8 +52,14 @@
             char w[MAXW];
             int c, n = 0, i, k, limit = 10, fold = 0;
             struct entry **all, *e;
        -    if (argc > 1)
        -        limit = atoi(argv[1]);
        +    for (i = 1; i < argc; i++) {
        +        if (strcmp(argv[i], "-i") == 0)
        +            fold = 1;
        +        else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
        +            limit = atoi(argv[++i]);
        +        else
        +            limit = atoi(argv[i]);
        +    }
             while ((c = getchar()) != EOF) {
                 if (isalpha(c)) {
                     if (n < MAXW - 1)
        """)
    t.sh("patch -p0 --dry-run < args.patch && patch -p0 < args.patch && rm -f args.patch wf.c.orig")
    t.sh("make")
    t.r("./wf -i -n 4 < texts/mixed.txt")
    t.r("./wf -n 4 < texts/mixed.txt")
    t.r("./wf -i < texts/crab.txt | head -n 3")
    # apostrophes: "it's" splits into "it" and "s"
    t.r("./wf -i -n 20 < texts/mixed.txt | grep -w -e s -e it")
    t.r("grep -n \"isalpha(c)\" wf.c")
    t.sh(r"""sed -i "s/        if (isalpha(c)) {/        if (isalpha(c) || (c == '\\\\'' \&\& n > 0)) {/" wf.c && grep -n 'isalpha(c)' wf.c""")
    t.sh("make; echo \"exit=$?\"")
    t.r("./wf -i -n 20 < texts/mixed.txt")
    # tests
    t.write("tests/run.sh", r"""
        #!/bin/sh
        # compares ./wf output for each tests/*.in with tests/*.out (args in tests/*.args)
        pass=0; fail=0
        for in in tests/*.in; do
            base=${in%.in}
            args=$(cat "$base.args" 2>/dev/null)
            if ./wf $args < "$in" | diff -u "$base.out" - > "$base.diff"; then
                pass=$((pass + 1)); rm -f "$base.diff"
            else
                fail=$((fail + 1)); echo "FAIL $base"; cat "$base.diff"
            fi
        done
        echo "$pass passed, $fail failed"
        [ "$fail" -eq 0 ]
        """, mode="0755")
    t.sh(r"""printf 'b a b c b a\n' > tests/basic.in && printf '      3 b\n      2 a\n      1 c\n' > tests/basic.out && : > tests/basic.args""")
    t.sh(r"""printf 'Go go GO stop\n' > tests/fold.in && printf '      3 go\n      1 stop\n' > tests/fold.out && echo '-i' > tests/fold.args""")
    t.sh(r"""printf 'x y z x y x w\n' > tests/limit.in && printf '      3 x\n      2 y\n' > tests/limit.out && echo '-n 2' > tests/limit.args""")
    t.sh(r"""printf "don't stop, don't\n" > tests/apos.in && printf "      2 don't\n      1 stop\n" > tests/apos.out && : > tests/apos.args""")
    t.r("ls tests && cat tests/*.args")
    t.sh("./tests/run.sh; echo \"exit=$?\"")
    t.r("cat tests/fold.diff 2>/dev/null; ./wf -i < tests/fold.in | od -c | head")
    t.r("grep -n 'strncpy\\|tolower' wf.c")
    t.r("./wf -i < tests/fold.in; ./wf < tests/fold.in")
    t.r("sed -n '/^static void add/,/^}/p' wf.c")
    t.r("./tests/run.sh | tail -n 1")
    t.sh(r"""sed -i 's/^        \.PHONY: clean$//' Makefile; printf 'test: wf\n\t./tests/run.sh\n.PHONY: test\n' >> Makefile && cat Makefile""")
    t.sh("make test")
    # trailing apostrophe: "crabs'" should not keep the quote
    t.sh(r"""printf "the crabs' shells\n" > tests/trail.in && printf "      1 crabs\n      1 shells\n      1 the\n" > tests/trail.out && : > tests/trail.args && ./tests/run.sh; echo "exit=$?" """)
    t.r("cat tests/trail.diff")
    t.r("grep -n 'w\\[n\\] = 0' wf.c")
    t.sh(r"""sed -i "s/            w\[n\] = 0; add(w); n = 0;/            while (n > 0 \&\& w[n - 1] == '\\\\'') n--;\n            if (n) { w[n] = 0; add(w); } n = 0;/" wf.c && sed -n '/while ((c = getchar/,/^    }/p' wf.c""")
    t.sh("make && make test")
    t.r("cat texts/*.txt | ./wf -i -n 12")
    # -s option: print summary
    t.r("grep -n 'qsort' wf.c")
    t.sh(r"""sed -i 's/^    qsort(all, k, sizeof \*all, cmp);/&\n    if (summary)\n        printf("%d distinct words\\n", k);/' wf.c && sed -i 's/limit = 10, fold = 0;/limit = 10, fold = 0, summary = 0;/' wf.c && sed -i 's/        if (strcmp(argv\[i\], "-i") == 0)/        if (strcmp(argv[i], "-s") == 0)\n            summary = 1;\n        else if (strcmp(argv[i], "-i") == 0)/' wf.c""")
    t.r("sed -n '/^int main/,/^}/p' wf.c")
    t.sh("make && ./wf -s -n 3 < texts/sandbox.txt")
    t.sh(r"""printf 'one two two\n' > tests/summary.in && printf '2 distinct words\n      2 two\n      1 one\n' > tests/summary.out && echo '-s' > tests/summary.args && make test""")
    t.r("./wf -s -i -n 0 < texts/crab.txt; ./wf -s -n 0 < texts/crab.txt")
    t.r("wc -l wf.c; grep -c printf wf.c")
    # install target
    t.sh(r"""printf 'install: wf\n\tmkdir -p $(PREFIX)/bin $(PREFIX)/share/wf\n\tcp wf $(PREFIX)/bin/wf\n\tcp texts/*.txt $(PREFIX)/share/wf/\n.PHONY: install\n' >> Makefile && make install && find dist | sort""")
    t.r("./dist/bin/wf -i -n 3 < dist/share/wf/crab.txt")
    t.write("texts/long.txt", "\n".join(
        " ".join(["checkpoint", "restore", "sandbox", "agent"][(i * j) % 4] for j in range(1, 12))
        for i in range(1, 40)) + "\n")
    t.r("wc -w texts/long.txt && ./wf -s < texts/long.txt")
    t.r("./wf -n 2 < texts/long.txt")
    t.r("awk '{for(i=1;i<=NF;i++)c[$i]++} END{for(w in c)print c[w], w}' texts/long.txt | sort -k1,1nr -k2")
    t.r("./wf -n 100 < texts/long.txt | awk '{print $1, $2}'")
    # long word truncation test
    t.sh(r"""python3 -c "print('a' * 100, 'b')" > tests/longword.in && python3 -c "print('%7d %s' % (1, 'a' * 63)); print('%7d %s' % (1, 'b'))" > tests/longword.out && : > tests/longword.args && make test""")
    t.r("ls tests | wc -l && ls tests")
    t.sh("make clean && make && make test 2>&1 | tail -n 1")
    t.r("cat Makefile")
    t.write("README.md", """
        # wf - word frequencies

            wf [-i] [-s] [-n N] < text

        -i  fold case, -s print the number of distinct words first, -n N show the top N (default 10).
        Words are letters plus inner apostrophes. `make test` runs tests/run.sh.
        """)
    t.sh("make install && ls -la dist/bin")
    t.r("for f in texts/*.txt; do echo \"== $f\"; ./wf -i -n 2 < $f; done")
    t.verify = r"""
        set -e
        make -s test | tail -n 1 | grep -qx '7 passed, 0 failed'
        printf 'A a b\n' | ./wf -i | head -n 1 | grep -q '2 a'
        printf "x y y\n" | ./wf -s | head -n 1 | grep -qx '2 distinct words'
        test -x dist/bin/wf
        cmp wf dist/bin/wf
        """
    t.volatile = ["tests/*.diff"]
    return t


# ======================================================================= venv
MKWHEEL = r'''
"""Build a pure-python wheel by hand (no `wheel` package in this image).

usage: python3 mkwheel.py SRC NAME VERSION OUTDIR [Requires-Dist ...]
SRC/NAME is the package directory; SRC/entry_points.txt is copied if present.
"""
import base64
import hashlib
import os
import sys
import zipfile

src, name, version, out = sys.argv[1:5]
requires = sys.argv[5:]
dist = "%s-%s.dist-info" % (name, version)
files = []
for root, dirs, names in os.walk(os.path.join(src, name)):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for fn in sorted(names):
        path = os.path.join(root, fn)
        with open(path, "rb") as f:
            files.append((os.path.relpath(path, src), f.read()))
meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
meta += "".join("Requires-Dist: %s\n" % r for r in requires)
files.append((dist + "/METADATA", meta.encode()))
files.append((dist + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: mkwheel\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
ep = os.path.join(src, "entry_points.txt")
if os.path.exists(ep):
    with open(ep, "rb") as f:
        files.append((dist + "/entry_points.txt", f.read()))
record = []
for arc, data in files:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
record.append(dist + "/RECORD,,")
files.append((dist + "/RECORD", ("\n".join(record) + "\n").encode()))
os.makedirs(out, exist_ok=True)
whl = os.path.join(out, "%s-%s-py3-none-any.whl" % (name, version))
with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
    for arc, data in files:
        info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, data)
print(whl)
'''

PIP = ".venv/bin/pip install -q --no-index --disable-pip-version-check --find-links wheels"
VENV_VOLATILE = ["**/__pycache__/**", "*.log"]


@traj
def venv_textkit():
    t = Traj("venv-textkit", "venv with two hand-built wheels (slug, textstats), upgrade one", "venv")
    t.r("python3 --version && ls -la")
    t.sh("python3 -m venv .venv && .venv/bin/python -m pip --version")
    t.r(".venv/bin/pip list --disable-pip-version-check 2>/dev/null")
    t.write("mkwheel.py", MKWHEEL)
    t.write("pkgs/slugkit/slugkit/__init__.py", '''
        """Make URL slugs."""
        import re

        __version__ = "1.0.0"


        def slugify(text, sep="-"):
            text = text.lower()
            text = re.sub(r"[^a-z0-9]+", sep, text)
            return text.strip(sep)
        ''')
    t.write("pkgs/textstats/textstats/__init__.py", '''
        """Simple text statistics."""

        __version__ = "1.0.0"


        def words(text):
            return text.split()


        def stats(text):
            w = words(text)
            return {"chars": len(text), "words": len(w), "lines": text.count("\\n")}
        ''')
    t.sh("python3 mkwheel.py pkgs/slugkit slugkit 1.0.0 wheels && python3 mkwheel.py pkgs/textstats textstats 1.0.0 wheels")
    t.r("ls -la wheels && python3 -m zipfile -l wheels/slugkit-1.0.0-py3-none-any.whl")
    t.sh(f"{PIP} slugkit textstats && .venv/bin/pip list --disable-pip-version-check | grep -E 'slugkit|textstats'")
    t.r(".venv/bin/python -c 'import slugkit; print(slugkit.slugify(\"Hello, Crab World!\"))'")
    t.write("posts.txt", """
        Checkpointing AI Agents
        Restore in 50 ms: How?
        Why Sandboxes Crash (and what to do)
        """)
    t.write("app.py", '''
        import json
        import sys

        import slugkit
        import textstats


        def main(path):
            out = []
            with open(path) as f:
                for line in f:
                    title = line.strip()
                    if not title:
                        continue
                    out.append({"slug": slugkit.slugify(title), "title": title, "stats": textstats.stats(title)})
            json.dump(out, sys.stdout, indent=2, sort_keys=True)
            print()


        if __name__ == "__main__":
            main(sys.argv[1])
        ''')
    t.sh(".venv/bin/python app.py posts.txt > index.json && cat index.json")
    t.r("grep -c slug index.json")
    t.r(".venv/bin/python -c 'import textstats; print(textstats.__version__, textstats.__file__)'")
    # upgrade textstats: add reading time, 1.1.0
    t.write("pkgs/textstats/textstats/__init__.py", '''
        """Simple text statistics."""

        __version__ = "1.1.0"


        def words(text):
            return text.split()


        def reading_seconds(text, wpm=200):
            return round(len(words(text)) * 60 / wpm, 1)


        def stats(text):
            w = words(text)
            return {"chars": len(text), "words": len(w), "lines": text.count("\\n"),
                    "reading_s": reading_seconds(text)}
        ''')
    t.sh("python3 mkwheel.py pkgs/textstats textstats 1.1.0 wheels && ls wheels")
    t.sh(f"{PIP} --upgrade textstats && .venv/bin/pip show --disable-pip-version-check textstats | head -n 2")
    t.sh(".venv/bin/python app.py posts.txt > index.json && head -n 12 index.json")
    t.r("ls .venv/lib/python3.11/site-packages | sort")
    t.r("cat .venv/lib/python3.11/site-packages/textstats-1.1.0.dist-info/RECORD")
    t.write("test_app.py", '''
        import unittest

        import slugkit
        import textstats


        class T(unittest.TestCase):
            def test_slug(self):
                self.assertEqual(slugkit.slugify("  A  b!! c "), "a-b-c")
                self.assertEqual(slugkit.slugify("x y", sep="_"), "x_y")

            def test_stats(self):
                s = textstats.stats("one two three four")
                self.assertEqual(s["words"], 4)
                self.assertEqual(s["reading_s"], 1.2)


        if __name__ == "__main__":
            unittest.main()
        ''')
    t.sh(".venv/bin/python -m unittest -v test_app 2>&1 | tail -n 5")
    t.r(".venv/bin/pip check --disable-pip-version-check")
    t.r("cat index.json | .venv/bin/python -c 'import json,sys; print([p[\"slug\"] for p in json.load(sys.stdin)])'")
    t.verify = r"""
        set -e
        .venv/bin/python -c 'import textstats, slugkit; assert textstats.__version__ == "1.1.0"; assert slugkit.slugify("A B") == "a-b"'
        .venv/bin/pip list --disable-pip-version-check | grep 'textstats *1.1.0' >/dev/null
        grep -q '"slug": "restore-in-50-ms-how"' index.json
        grep -q reading_s index.json
        .venv/bin/python -m unittest -q test_app
        """
    t.volatile = VENV_VOLATILE
    return t


@traj
def venv_geometry():
    t = Traj("venv-geometry", "venv: vecmath + shapes wheels with a dependency, app, upgrade vecmath", "venv")
    t.r("ls -la; python3 -c 'import sys; print(sys.prefix)'")
    t.sh("python3 -m venv .venv")
    t.r(".venv/bin/python -c 'import sys; print(sys.prefix != sys.base_prefix)'")
    t.write("tools/mkwheel.py", MKWHEEL)
    t.write("src/vecmath/vecmath/__init__.py", '''
        """2-D vectors."""
        import math

        __version__ = "0.1.0"


        class Vec:
            __slots__ = ("x", "y")

            def __init__(self, x, y):
                self.x, self.y = x, y

            def __add__(self, o):
                return Vec(self.x + o.x, self.y + o.y)

            def __sub__(self, o):
                return Vec(self.x - o.x, self.y - o.y)

            def cross(self, o):
                return self.x * o.y - self.y * o.x

            def length(self):
                return math.hypot(self.x, self.y)

            def __repr__(self):
                return "Vec(%g, %g)" % (self.x, self.y)
        ''')
    t.write("src/shapes/shapes/__init__.py", '''
        """Polygons built on vecmath."""
        from vecmath import Vec

        __version__ = "0.1.0"


        class Polygon:
            def __init__(self, points):
                self.pts = [Vec(x, y) for x, y in points]

            def area(self):
                n = len(self.pts)
                s = sum(self.pts[i].cross(self.pts[(i + 1) % n]) for i in range(n))
                return abs(s) / 2

            def perimeter(self):
                n = len(self.pts)
                return sum((self.pts[(i + 1) % n] - self.pts[i]).length() for i in range(n))
        ''')
    t.sh("python3 tools/mkwheel.py src/vecmath vecmath 0.1.0 wheels")
    t.sh("python3 tools/mkwheel.py src/shapes shapes 0.1.0 wheels 'vecmath>=0.1'")
    t.r("python3 -m zipfile -l wheels/shapes-0.1.0-py3-none-any.whl")
    t.r("python3 -c \"import zipfile; print(zipfile.ZipFile('wheels/shapes-0.1.0-py3-none-any.whl').read('shapes-0.1.0.dist-info/METADATA').decode())\"")
    t.sh(f"{PIP} shapes && .venv/bin/pip list --disable-pip-version-check | grep -E 'shapes|vecmath'")
    t.r(".venv/bin/python -c 'from shapes import Polygon; print(Polygon([(0,0),(4,0),(4,3)]).area())'")
    t.write("plots.csv", """
        name,points
        square,0 0;2 0;2 2;0 2
        triangle,0 0;4 0;4 3
        lot7,0 0;10 0;10 5;6 8;0 5
        """)
    t.write("survey.py", '''
        """Area/perimeter report for plots.csv."""
        import csv
        import sys

        from shapes import Polygon


        def parse(points):
            return [tuple(float(v) for v in p.split()) for p in points.split(";")]


        def main(path):
            rows = []
            with open(path, newline="") as f:
                for r in csv.DictReader(f):
                    poly = Polygon(parse(r["points"]))
                    rows.append((r["name"], poly.area(), poly.perimeter()))
            for name, a, p in rows:
                print("%-10s area=%8.2f perimeter=%8.2f" % (name, a, p))
            print("%-10s area=%8.2f" % ("TOTAL", sum(r[1] for r in rows)))


        if __name__ == "__main__":
            main(sys.argv[1] if len(sys.argv) > 1 else "plots.csv")
        ''')
    t.sh(".venv/bin/python survey.py | tee report-v1.txt")
    t.r("cat report-v1.txt | grep TOTAL")
    t.write("tests/test_shapes.py", '''
        import unittest

        from shapes import Polygon
        from vecmath import Vec


        class ShapeTests(unittest.TestCase):
            def test_square(self):
                sq = Polygon([(0, 0), (1, 0), (1, 1), (0, 1)])
                self.assertEqual(sq.area(), 1)
                self.assertEqual(sq.perimeter(), 4)

            def test_vec(self):
                self.assertEqual((Vec(3, 4)).length(), 5)
        ''')
    t.sh(".venv/bin/python -m unittest discover -s tests -v 2>&1 | tail -n 4")
    # want centroid: needs Vec scaling -> vecmath 0.2.0
    t.r(".venv/bin/python -c 'from vecmath import Vec; print(Vec(1,2) * 3)' 2>&1 | tail -n 1")
    t.write("src/vecmath/vecmath/__init__.py", '''
        """2-D vectors."""
        import math

        __version__ = "0.2.0"


        class Vec:
            __slots__ = ("x", "y")

            def __init__(self, x, y):
                self.x, self.y = x, y

            def __add__(self, o):
                return Vec(self.x + o.x, self.y + o.y)

            def __sub__(self, o):
                return Vec(self.x - o.x, self.y - o.y)

            def __mul__(self, k):
                return Vec(self.x * k, self.y * k)

            def __eq__(self, o):
                return (self.x, self.y) == (o.x, o.y)

            def cross(self, o):
                return self.x * o.y - self.y * o.x

            def length(self):
                return math.hypot(self.x, self.y)

            def __repr__(self):
                return "Vec(%g, %g)" % (self.x, self.y)


        def centroid(points):
            n = len(points)
            s = Vec(0, 0)
            for p in points:
                s = s + p
            return s * (1 / n)
        ''')
    t.sh("python3 tools/mkwheel.py src/vecmath vecmath 0.2.0 wheels && ls wheels")
    t.sh(f"{PIP} --upgrade vecmath && .venv/bin/pip list --disable-pip-version-check | grep vecmath")
    t.r(".venv/bin/python -c 'from vecmath import Vec, centroid; print(centroid([Vec(0,0), Vec(4,0), Vec(4,4), Vec(0,4)]))'")
    t.sh(r"""sed -i 's/^from shapes import Polygon$/from shapes import Polygon\nfrom vecmath import centroid/' survey.py && sed -i 's/            rows.append((r\["name"\], poly.area(), poly.perimeter()))/            c = centroid(poly.pts)\n            rows.append((r["name"], poly.area(), poly.perimeter(), c))/' survey.py && sed -i 's/    for name, a, p in rows:/    for name, a, p, c in rows:/; s/        print("%-10s area=%8.2f perimeter=%8.2f" % (name, a, p))/        print("%-10s area=%8.2f perimeter=%8.2f centroid=(%.2f, %.2f)" % (name, a, p, c.x, c.y))/' survey.py && cat survey.py""")
    t.sh(".venv/bin/python survey.py | tee report.txt")
    t.r("diff report-v1.txt report.txt; true")
    t.r(".venv/bin/pip check --disable-pip-version-check && .venv/bin/pip show --disable-pip-version-check shapes | grep -i requires")
    t.sh(".venv/bin/python -m unittest discover -s tests 2>&1 | tail -n 1")
    t.r("ls .venv/lib/python3.11/site-packages/ | grep -v pip")
    t.verify = r"""
        set -e
        .venv/bin/python -c 'import vecmath; assert vecmath.__version__ == "0.2.0"'
        grep -q 'TOTAL      area=   75.00' report.txt
        grep -q 'centroid=(1.00, 1.00)' report.txt
        .venv/bin/python -m unittest discover -s tests -q
        ls wheels | grep -c whl | grep -qx 3
        """
    t.volatile = VENV_VOLATILE
    return t


@traj
def venv_todo_cli():
    t = Traj("venv-todo-cli", "venv: three local wheels incl. a console script, tests, upgrade", "venv")
    t.r("ls -la && python3 -m venv --help | head -n 3")
    t.sh("python3 -m venv .venv && ls .venv/bin")
    t.r(".venv/bin/python -m pip list --disable-pip-version-check")
    t.write("mkwheel.py", MKWHEEL)
    t.r("python3 mkwheel.py 2>&1 | tail -n 1; head -n 6 mkwheel.py")
    # package 1: storage
    t.write("pkgs/todostore/todostore/__init__.py", '''
        """JSON-file backed todo list."""
        import json
        import os

        __version__ = "1.0.0"


        class Store:
            def __init__(self, path):
                self.path = path
                self.items = []
                if os.path.exists(path):
                    with open(path) as f:
                        self.items = json.load(f)

            def add(self, text, prio=2):
                nid = max([i["id"] for i in self.items], default=0) + 1
                self.items.append({"id": nid, "text": text, "prio": prio, "done": False})
                return nid

            def done(self, nid):
                for i in self.items:
                    if i["id"] == nid:
                        i["done"] = True
                        return True
                return False

            def save(self):
                with open(self.path, "w") as f:
                    json.dump(self.items, f, indent=1, sort_keys=True)
                    f.write("\\n")
        ''')
    # package 2: formatting
    t.write("pkgs/todofmt/todofmt/__init__.py", '''
        """Render todo items as text."""

        __version__ = "1.0.0"


        def render(items):
            lines = []
            for i in items:
                box = "[x]" if i["done"] else "[ ]"
                lines.append("%s %3d %s" % (box, i["id"], i["text"]))
            return "\\n".join(lines)
        ''')
    # package 3: cli with console script
    t.write("pkgs/todocli/todocli/__init__.py", '''
        __version__ = "1.0.0"
        ''')
    t.write("pkgs/todocli/todocli/main.py", '''
        """todo - tiny command line todo list."""
        import argparse
        import sys

        from todofmt import render
        from todostore import Store


        def main(argv=None):
            ap = argparse.ArgumentParser(prog="todo")
            ap.add_argument("--file", default="todo.json")
            sub = ap.add_subparsers(dest="cmd", required=True)
            a = sub.add_parser("add")
            a.add_argument("text")
            a.add_argument("--prio", type=int, default=2)
            d = sub.add_parser("done")
            d.add_argument("id", type=int)
            sub.add_parser("list")
            args = ap.parse_args(argv)
            st = Store(args.file)
            if args.cmd == "add":
                print("added", st.add(args.text, args.prio))
            elif args.cmd == "done":
                if not st.done(args.id):
                    print("no such item", args.id, file=sys.stderr)
                    return 1
            elif args.cmd == "list":
                print(render(st.items))
            st.save()
            return 0


        if __name__ == "__main__":
            sys.exit(main())
        ''')
    t.write("pkgs/todocli/entry_points.txt", """
        [console_scripts]
        todo = todocli.main:main
        """)
    t.r("find pkgs -type f | sort")
    t.sh("for p in todostore todofmt; do python3 mkwheel.py pkgs/$p $p 1.0.0 wheels; done")
    t.sh("python3 mkwheel.py pkgs/todocli todocli 1.0.0 wheels todostore todofmt")
    t.r("ls -la wheels")
    t.r("python3 -m zipfile -l wheels/todocli-1.0.0-py3-none-any.whl")
    t.sh(f"{PIP} todocli; echo \"exit=$?\"")
    t.r(".venv/bin/pip list --disable-pip-version-check | grep todo")
    t.r("ls -la .venv/bin/todo && head -n 3 .venv/bin/todo")
    t.sh(".venv/bin/todo add 'write the checkpoint design doc' --prio 1")
    t.sh(".venv/bin/todo add 'benchmark restore latency'")
    t.sh(".venv/bin/todo add 'fix flaky shim test' --prio 1")
    t.sh(".venv/bin/todo add 'update README'")
    t.r(".venv/bin/todo list")
    t.r("cat todo.json")
    t.sh(".venv/bin/todo done 3 && .venv/bin/todo list")
    t.sh(".venv/bin/todo done 9; echo \"exit=$?\"")
    t.write("tests/test_todo.py", '''
        import os
        import tempfile
        import unittest

        from todocli.main import main
        from todofmt import render
        from todostore import Store


        class TodoTests(unittest.TestCase):
            def setUp(self):
                self.dir = tempfile.TemporaryDirectory()
                self.path = os.path.join(self.dir.name, "t.json")

            def tearDown(self):
                self.dir.cleanup()

            def test_add_and_done(self):
                s = Store(self.path)
                a = s.add("a")
                b = s.add("b")
                self.assertEqual((a, b), (1, 2))
                self.assertTrue(s.done(2))
                self.assertFalse(s.done(5))

            def test_render(self):
                out = render([{"id": 1, "text": "x", "done": True, "prio": 1}])
                self.assertEqual(out, "[x]   1 x")

            def test_cli_roundtrip(self):
                self.assertEqual(main(["--file", self.path, "add", "hello"]), 0)
                self.assertEqual(Store(self.path).items[0]["text"], "hello")


        if __name__ == "__main__":
            unittest.main()
        ''')
    t.sh(".venv/bin/python -m unittest discover -s tests -v 2>&1 | tail -n 6")
    # feature: sort by priority, show prio -> todofmt 1.1.0
    t.r("cat .venv/lib/python3.11/site-packages/todofmt/__init__.py")
    t.write("pkgs/todofmt/todofmt/__init__.py", '''
        """Render todo items as text."""

        __version__ = "1.1.0"

        PRIO = {1: "!", 2: " ", 3: "."}


        def render(items, by_prio=False):
            if by_prio:
                items = sorted(items, key=lambda i: (i["done"], i["prio"], i["id"]))
            lines = []
            for i in items:
                box = "[x]" if i["done"] else "[ ]"
                lines.append("%s %3d %s%s" % (box, i["id"], PRIO.get(i["prio"], "?"), i["text"]))
            return "\\n".join(lines)
        ''')
    t.sh("python3 mkwheel.py pkgs/todofmt todofmt 1.1.0 wheels && ls wheels")
    t.sh(f"{PIP} --upgrade todofmt && .venv/bin/pip list --disable-pip-version-check | grep todofmt")
    t.r(".venv/bin/todo list")
    t.sh(".venv/bin/python -m unittest discover -s tests 2>&1 | tail -n 3")
    t.r("grep -n 'render' tests/test_todo.py")
    t.sh("""sed -i 's/self.assertEqual(out, "\\[x\\]   1 x")/self.assertEqual(out, "[x]   1 !x")/' tests/test_todo.py && .venv/bin/python -m unittest discover -s tests 2>&1 | tail -n 1""")
    t.r("grep -n 'list' pkgs/todocli/todocli/main.py")
    t.sh(r"""sed -i 's/    sub.add_parser("list")/    ls = sub.add_parser("list")\n    ls.add_argument("--prio", action="store_true")/; s/        print(render(st.items))/        print(render(st.items, by_prio=args.prio))/' pkgs/todocli/todocli/main.py && sed -i 's/^__version__ = "1.0.0"/__version__ = "1.1.0"/' pkgs/todocli/todocli/__init__.py && sed -n '/add_parser("list")/,+2p' pkgs/todocli/todocli/main.py""")
    t.sh("python3 mkwheel.py pkgs/todocli todocli 1.1.0 wheels todostore 'todofmt>=1.1'")
    t.sh(f"{PIP} --upgrade todocli && .venv/bin/pip list --disable-pip-version-check | grep todo")
    t.r(".venv/bin/todo list --prio")
    t.sh(".venv/bin/todo add 'triage new issues' --prio 3 && .venv/bin/todo done 1 && .venv/bin/todo list --prio | tee board.txt")
    t.sh(".venv/bin/python -m unittest discover -s tests 2>&1 | tail -n 1")
    t.r(".venv/bin/pip check --disable-pip-version-check; cat .venv/lib/python3.11/site-packages/todocli-1.1.0.dist-info/entry_points.txt")
    t.r("ls wheels && cat todo.json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'")
    t.verify = r"""
        set -e
        .venv/bin/todo list --prio > /tmp/board.txt
        cmp /tmp/board.txt board.txt
        head -n 1 board.txt | grep -qx '\[ \]   2  benchmark restore latency'
        grep -qx '\[x\]   1 !write the checkpoint design doc' board.txt
        .venv/bin/pip list --disable-pip-version-check | grep 'todofmt *1.1.0' >/dev/null
        .venv/bin/pip list --disable-pip-version-check | grep 'todocli *1.1.0' >/dev/null
        .venv/bin/python -m unittest discover -s tests -q
        """
    t.volatile = VENV_VOLATILE
    return t


# ===================================================================== server
def start_server(t, port, script="server.py", extra=""):
    t.sh(f"nohup python3 {script}{extra} </dev/null >server.log 2>&1 &\necho $! > server.pid\n" + wait_port(port))


SERVER_VOLATILE = ["*.log", "*.pid", "*-journal", "**/__pycache__/**"]

NOTES_SERVER = r'''
"""Notes service: JSON over HTTP, stored in sqlite (notes.db)."""
import json
import sqlite3
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse

PORT = 9011
db = sqlite3.connect("notes.db")
db.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL, tag TEXT)")
db.commit()


def row(r):
    return {"id": r[0], "title": r[1], "body": r[2], "tag": r[3]}


class H(BaseHTTPRequestHandler):
    def reply(self, code, obj):
        data = (json.dumps(obj, sort_keys=True) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length", 0))
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self):
        u = urlparse(self.path)
        if u.path == "/health":
            return self.reply(200, {"ok": True})
        if u.path == "/notes":
            q = parse_qs(u.query)
            if "tag" in q:
                rows = db.execute("SELECT * FROM notes WHERE tag = ? ORDER BY id", (q["tag"][0],))
            else:
                rows = db.execute("SELECT * FROM notes ORDER BY id")
            return self.reply(200, [row(r) for r in rows])
        if u.path.startswith("/notes/"):
            r = db.execute("SELECT * FROM notes WHERE id = ?", (int(u.path[7:]),)).fetchone()
            return self.reply(200, row(r)) if r else self.reply(404, {"error": "not found"})
        self.reply(404, {"error": "no route"})

    def do_POST(self):
        if self.path != "/notes":
            return self.reply(404, {"error": "no route"})
        b = self.body()
        cur = db.execute("INSERT INTO notes (title, body, tag) VALUES (?, ?, ?)", (b["title"], b.get("body", ""), b.get("tag")))
        db.commit()
        self.reply(201, {"id": cur.lastrowid})

    def do_DELETE(self):
        if not self.path.startswith("/notes/"):
            return self.reply(404, {"error": "no route"})
        n = db.execute("DELETE FROM notes WHERE id = ?", (int(self.path[7:]),)).rowcount
        db.commit()
        self.reply(200 if n else 404, {"deleted": n})

    def log_message(self, fmt, *args):
        pass


if __name__ == "__main__":
    print("listening on", PORT, flush=True)
    HTTPServer(("127.0.0.1", PORT), H).serve_forever()
'''

NOTES_CLIENT = r'''
"""Tiny client for the notes service: python3 client.py METHOD PATH [JSON]"""
import json
import sys
import urllib.error
import urllib.request

BASE = "http://127.0.0.1:9011"


def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(BASE + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        print(json.dumps(call("GET", "/notes")[1], indent=1, sort_keys=True))
        sys.exit(0)
    body = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    status, obj = call(sys.argv[1], sys.argv[2], body)
    print(status, json.dumps(obj, sort_keys=True))
'''


@traj
def srv_notes():
    t = Traj("srv-notes", "Notes HTTP service on sqlite: start, add, tag, edit, query", "server")
    t.r("ls -la && python3 -c 'import sqlite3; print(sqlite3.sqlite_version)'")
    t.write("server.py", NOTES_SERVER)
    t.r("python3 -m py_compile server.py && echo syntax ok")
    start_server(t, 9011)
    t.r("cat server.log; python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9011/health').read().decode())\"")
    t.write("client.py", NOTES_CLIENT)
    notes = [("Checkpoint design", "CRIU + overlay snapshots", "design"),
             ("Restore budget", "target 50 ms p50", "perf"),
             ("Shim logging", "log to journald", "ops"),
             ("Snapshot GC", "drop snapshots older than 10 generations", "design"),
             ("Bench harness", "replay trajectories", "perf")]
    for title, body, tag in notes:
        t.sh("python3 client.py POST /notes '%s'" % json.dumps({"title": title, "body": body, "tag": tag}))
    t.r("python3 client.py GET /notes")
    t.r("python3 client.py GET '/notes?tag=design'")
    t.r("python3 client.py GET /notes/2")
    t.r("python3 client.py GET /notes/42")
    t.r("sqlite3 -readonly notes.db 'SELECT tag, count(*) FROM notes GROUP BY tag ORDER BY tag'")
    # need PUT for edits -> add it, restart
    t.r("python3 client.py PUT /notes/3 '{\"tag\": \"design\"}' 2>&1 | tail -n 1")
    t.r("grep -n 'def do_' server.py")
    t.write("put.patch", r'''
        --- server.py
        +++ server.py
        @@ -58,6 +58,18 @@
                 db.commit()
                 self.reply(201, {"id": cur.lastrowid})
         
        +    def do_PUT(self):
        +        if not self.path.startswith("/notes/"):
        +            return self.reply(404, {"error": "no route"})
        +        nid = int(self.path[7:])
        +        b = self.body()
        +        for col in ("title", "body", "tag"):
        +            if col in b:
        +                db.execute("UPDATE notes SET %s = ? WHERE id = ?" % col, (b[col], nid))
        +        db.commit()
        +        r = db.execute("SELECT * FROM notes WHERE id = ?", (nid,)).fetchone()
        +        return self.reply(200, row(r)) if r else self.reply(404, {"error": "not found"})
        +
             def do_DELETE(self):
                 if not self.path.startswith("/notes/"):
                     return self.reply(404, {"error": "no route"})
        ''')
    t.sh("patch -p0 < put.patch && rm -f put.patch server.py.orig && python3 -m py_compile server.py && rm -rf __pycache__ && echo ok")
    t.sh("kill $(cat server.pid) && python3 -c \"\nimport socket, time\nfor i in range(50):\n    try:\n        socket.create_connection(('127.0.0.1', 9011), 0.2).close(); time.sleep(0.1)\n    except OSError:\n        print('stopped'); break\n\"")
    start_server(t, 9011)
    t.sh("python3 client.py PUT /notes/3 '{\"tag\": \"design\", \"body\": \"log to journald, rotate daily\"}'")
    t.r("python3 client.py GET '/notes?tag=design'")
    t.sh("python3 client.py DELETE /notes/5")
    t.r("python3 client.py DELETE /notes/5")
    t.sh("python3 client.py POST /notes '{\"title\": \"Replay harness\", \"body\": \"deterministic LLM replay\", \"tag\": \"perf\"}'")
    t.r("python3 client.py GET /notes | head -c 600; echo")
    t.r("sqlite3 -readonly notes.db 'SELECT id, title, tag FROM notes ORDER BY id'")
    t.write("export.py", '''
        """Export notes grouped by tag to notes.md (reads from the running service)."""
        from client import call

        status, notes = call("GET", "/notes")
        assert status == 200
        out = ["# Notes", ""]
        for tag in sorted({n["tag"] or "" for n in notes}):
            out.append("## " + (tag or "untagged"))
            for n in notes:
                if (n["tag"] or "") == tag:
                    out.append("- %s: %s" % (n["title"], n["body"]))
            out.append("")
        with open("notes.md", "w") as f:
            f.write("\\n".join(out))
        print(len(notes), "notes exported")
        ''')
    t.sh("python3 export.py && cat notes.md")
    t.r("python3 client.py GET /health")
    t.r("ls -la")
    t.verify = r"""
        set -e
        python3 client.py GET /health | grep -q '^200'
        python3 client.py GET '/notes?tag=design' | python3 -c 'import json,sys; s,o=sys.stdin.read().split(" ",1); assert [n["id"] for n in json.loads(o)] == [1, 3, 4], o'
        python3 client.py GET /notes/5 | grep -q 'Replay harness'
        grep -q 'rotate daily' notes.md
        """
    t.probe = "python3 client.py dump"
    t.volatile = SERVER_VOLATILE
    return t


INV_SERVER = r'''
"""Inventory service: items and stock movements in sqlite (inventory.db)."""
import json
import sqlite3
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import urlparse

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 9012
db = sqlite3.connect("inventory.db")
db.executescript("""
CREATE TABLE IF NOT EXISTS items (sku TEXT PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS moves (id INTEGER PRIMARY KEY, sku TEXT NOT NULL REFERENCES items(sku), qty INTEGER NOT NULL, note TEXT);
""")
db.commit()


def stock(sku):
    return db.execute("SELECT coalesce(sum(qty), 0) FROM moves WHERE sku = ?", (sku,)).fetchone()[0]


class H(BaseHTTPRequestHandler):
    def reply(self, code, obj):
        data = (json.dumps(obj, sort_keys=True) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def do_GET(self):
        path = urlparse(self.path).path
        if path == "/health":
            return self.reply(200, {"ok": True})
        if path == "/items":
            rows = db.execute("SELECT sku, name, price_cents FROM items ORDER BY sku").fetchall()
            return self.reply(200, [{"sku": s, "name": n, "price_cents": p, "stock": stock(s)} for s, n, p in rows])
        if path == "/report":
            rows = db.execute("SELECT sku, price_cents FROM items ORDER BY sku").fetchall()
            value = sum(p * stock(s) for s, p in rows)
            return self.reply(200, {"items": len(rows), "stock_value_cents": value})
        self.reply(404, {"error": "no route"})

    def do_POST(self):
        b = self.body()
        if self.path == "/items":
            db.execute("INSERT OR REPLACE INTO items VALUES (?, ?, ?)", (b["sku"], b["name"], b["price_cents"]))
            db.commit()
            return self.reply(201, {"sku": b["sku"]})
        if self.path == "/moves":
            if db.execute("SELECT 1 FROM items WHERE sku = ?", (b["sku"],)).fetchone() is None:
                return self.reply(400, {"error": "unknown sku"})
            db.execute("INSERT INTO moves (sku, qty, note) VALUES (?, ?, ?)", (b["sku"], b["qty"], b.get("note")))
            db.commit()
            return self.reply(201, {"sku": b["sku"], "stock": stock(b["sku"])})
        self.reply(404, {"error": "no route"})

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.command, self.path))


if __name__ == "__main__":
    print("inventory on", PORT, flush=True)
    HTTPServer(("127.0.0.1", PORT), H).serve_forever()
'''

INV_CLIENT = r'''
"""usage: python3 inv.py get PATH | post PATH JSON | dump"""
import json
import sys
import urllib.error
import urllib.request

BASE = "http://127.0.0.1:9012"


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "dump":
        print(json.dumps({"items": call("GET", "/items")[1], "report": call("GET", "/report")[1]}, indent=1, sort_keys=True))
    elif cmd == "get":
        print(*call("GET", sys.argv[2]))
    else:
        print(*call("POST", sys.argv[2], json.loads(sys.argv[3])))
'''


@traj
def srv_inventory():
    t = Traj("srv-inventory", "Inventory HTTP service on sqlite with stock moves and a report", "server")
    t.r("ls -la; python3 --version")
    t.write("server.py", INV_SERVER)
    t.write("inv.py", INV_CLIENT)
    t.r("python3 -m py_compile server.py inv.py && rm -rf __pycache__ && echo ok")
    start_server(t, 9012)
    t.r("python3 inv.py get /health && cat server.log")
    items = [("BOLT-M4", "M4 bolt", 12), ("NUT-M4", "M4 nut", 5), ("WASH-M4", "M4 washer", 3),
             ("BRKT-L", "L bracket", 250), ("RAIL-1M", "DIN rail 1 m", 480), ("PSU-24", "24 V power supply", 3900)]
    for sku, name, price in items:
        t.sh("python3 inv.py post /items '%s'" % json.dumps({"sku": sku, "name": name, "price_cents": price}))
    t.r("python3 inv.py get /items")
    moves = [("BOLT-M4", 500, "initial"), ("NUT-M4", 500, "initial"), ("WASH-M4", 1000, "initial"),
             ("BRKT-L", 40, "initial"), ("RAIL-1M", 25, "initial"), ("PSU-24", 6, "initial"),
             ("BOLT-M4", -120, "order 1001"), ("NUT-M4", -120, "order 1001"), ("BRKT-L", -8, "order 1001"),
             ("PSU-24", -2, "order 1002"), ("RAIL-1M", -3, "order 1002")]
    for sku, qty, note in moves:
        t.sh("python3 inv.py post /moves '%s'" % json.dumps({"sku": sku, "qty": qty, "note": note}))
    t.r("python3 inv.py get /report")
    t.r("sqlite3 -readonly inventory.db 'SELECT sku, sum(qty) FROM moves GROUP BY sku ORDER BY sku'")
    t.r("python3 inv.py post /moves '{\"sku\": \"GEAR-9\", \"qty\": 1}'")
    # bug: stock can go negative
    t.sh("python3 inv.py post /moves '{\"sku\": \"PSU-24\", \"qty\": -10, \"note\": \"order 1003\"}'")
    t.r("python3 -c \"from inv import call; print([i for i in call('GET', '/items')[1] if i['stock'] < 0])\"")
    t.r("sqlite3 -readonly inventory.db \"SELECT id, sku, qty, note FROM moves WHERE sku = 'PSU-24'\"")
    t.sh("sqlite3 inventory.db \"DELETE FROM moves WHERE note = 'order 1003'\" && sqlite3 -readonly inventory.db 'SELECT count(*) FROM moves'")
    t.r("grep -n 'unknown sku' server.py")
    t.write("fix_stock.py", """
        src = open("server.py").read()
        old = '            db.execute("INSERT INTO moves (sku, qty, note)'
        new = ('            if stock(b["sku"]) + b["qty"] < 0:\\n'
               '                return self.reply(409, {"error": "insufficient stock", "stock": stock(b["sku"])})\\n' + old)
        assert src.count(old) == 1
        open("server.py", "w").write(src.replace(old, new))
        print("patched")
        """)
    t.sh("python3 fix_stock.py && rm fix_stock.py")
    t.r("sed -n '/def do_POST/,/no route/p' server.py")
    t.sh("python3 -m py_compile server.py && rm -rf __pycache__ && kill $(cat server.pid); python3 -c \"\nimport socket, time\nfor i in range(50):\n    try:\n        socket.create_connection(('127.0.0.1', 9012), 0.2).close(); time.sleep(0.1)\n    except OSError:\n        print('stopped'); break\n\"")
    start_server(t, 9012)
    t.r("python3 inv.py post /moves '{\"sku\": \"PSU-24\", \"qty\": -10, \"note\": \"order 1003\"}'")
    t.sh("python3 inv.py post /moves '{\"sku\": \"PSU-24\", \"qty\": -4, \"note\": \"order 1003\"}'")
    for sku, qty, note in [("PSU-24", 10, "restock"), ("BOLT-M4", -200, "order 1004"), ("NUT-M4", -200, "order 1004"),
                           ("WASH-M4", -400, "order 1004"), ("BRKT-L", 20, "restock"), ("PSU-24", -3, "order 1005")]:
        t.sh("python3 inv.py post /moves '%s'" % json.dumps({"sku": sku, "qty": qty, "note": note}))
    t.r("python3 inv.py get /items")
    t.r("python3 inv.py get /report")
    t.sh("python3 inv.py post /items '{\"sku\": \"PSU-24\", \"name\": \"24 V power supply\", \"price_cents\": 3750}'")
    t.write("report.py", '''
        """Low-stock report from the running inventory service."""
        from inv import call

        status, items = call("GET", "/items")
        assert status == 200
        lines = ["sku       stock  value"]
        for i in items:
            flag = "  LOW" if i["stock"] < 50 else ""
            lines.append("%-8s %6d %8.2f%s" % (i["sku"], i["stock"], i["stock"] * i["price_cents"] / 100, flag))
        total = call("GET", "/report")[1]["stock_value_cents"] / 100
        lines.append("total %.2f" % total)
        open("lowstock.txt", "w").write("\\n".join(lines) + "\\n")
        print("\\n".join(lines))
        ''')
    t.sh("python3 report.py")
    t.r("grep LOW lowstock.txt | wc -l")
    t.r("sqlite3 -readonly inventory.db 'SELECT note, count(*) FROM moves GROUP BY note ORDER BY note'")
    t.r("tail -n 5 server.log")
    t.verify = r"""
        set -e
        python3 inv.py get /health | grep -q '^200'
        python3 inv.py get /report | grep -q "'stock_value_cents': 54670"
        python3 inv.py post /moves '{"sku": "PSU-24", "qty": -999}' | grep -q '^409'
        grep -q '^total 546.70' lowstock.txt
        test "$(sqlite3 inventory.db 'SELECT sum(qty) FROM moves WHERE sku = "PSU-24"')" = 7
        """
    t.probe = "python3 inv.py dump"
    t.volatile = SERVER_VOLATILE
    return t


SHORT_SERVER = r'''
"""URL shortener: POST /shorten {"url"}, GET /<code> -> 302, GET /stats. sqlite: links.db"""
import json
import sqlite3
from http.server import BaseHTTPRequestHandler, HTTPServer

ALPHA = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
db = sqlite3.connect("links.db")
db.execute("CREATE TABLE IF NOT EXISTS links (id INTEGER PRIMARY KEY, url TEXT UNIQUE NOT NULL, hits INTEGER NOT NULL DEFAULT 0)")
db.commit()


def encode(n):
    s = ""
    n += 1000
    while n:
        n, r = divmod(n, 62)
        s = ALPHA[r] + s
    return s


def decode(s):
    n = 0
    for ch in s:
        n = n * 62 + ALPHA.index(ch)
    return n - 1000


class H(BaseHTTPRequestHandler):
    def reply(self, code, obj, headers=()):
        data = (json.dumps(obj, sort_keys=True) + "\n").encode()
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        if self.path != "/shorten":
            return self.reply(404, {"error": "no route"})
        url = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["url"]
        db.execute("INSERT OR IGNORE INTO links (url) VALUES (?)", (url,))
        db.commit()
        nid = db.execute("SELECT id FROM links WHERE url = ?", (url,)).fetchone()[0]
        self.reply(200, {"code": encode(nid), "url": url})

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, {"ok": True})
        if self.path == "/stats":
            rows = db.execute("SELECT id, url, hits FROM links ORDER BY id").fetchall()
            return self.reply(200, [{"code": encode(i), "url": u, "hits": h} for i, u, h in rows])
        try:
            nid = decode(self.path[1:])
        except ValueError:
            return self.reply(404, {"error": "bad code"})
        r = db.execute("SELECT url FROM links WHERE id = ?", (nid,)).fetchone()
        if not r:
            return self.reply(404, {"error": "unknown code"})
        db.execute("UPDATE links SET hits = hits + 1 WHERE id = ?", (nid,))
        db.commit()
        self.reply(302, {"location": r[0]}, [("Location", r[0])])

    def log_message(self, fmt, *args):
        pass


HTTPServer(("127.0.0.1", 9013), H).serve_forever()
'''


@traj
def srv_shortener():
    t = Traj("srv-shortener", "URL shortener service on sqlite: shorten, follow, stats", "server")
    t.r("ls -la")
    t.write("shortener.py", SHORT_SERVER)
    t.sh("nohup python3 shortener.py </dev/null >shortener.log 2>&1 &\necho $! > shortener.pid\n" + wait_port(9013))
    t.write("sh.py", '''
        import http.client
        import json
        import sys


        def req(method, path, body=None):
            c = http.client.HTTPConnection("127.0.0.1", 9013, timeout=5)
            c.request(method, path, body=None if body is None else json.dumps(body))
            r = c.getresponse()
            return r.status, r.getheader("Location"), json.loads(r.read())


        if __name__ == "__main__":
            if sys.argv[1] == "add":
                print(req("POST", "/shorten", {"url": sys.argv[2]})[2]["code"])
            elif sys.argv[1] == "open":
                print(*req("GET", "/" + sys.argv[2])[:2])
            elif sys.argv[1] == "stats":
                for s in req("GET", "/stats")[2]:
                    print(s["code"], s["hits"], s["url"])
        ''')
    urls = ["https://example.com/docs/checkpoint", "https://example.com/docs/restore",
            "https://example.com/blog/crab-0-1", "https://example.com/bench"]
    for u in urls:
        t.sh(f"python3 sh.py add {u}")
    t.r("python3 sh.py add https://example.com/docs/restore")
    t.r("python3 sh.py stats")
    for code, n in [("g9", 3), ("ga", 1), ("gb", 2)]:
        t.sh("for i in %s; do python3 sh.py open %s; done" % (" ".join(str(i) for i in range(n)), code))
    t.r("python3 sh.py open zzzz; python3 sh.py open 'g!'")
    t.r("python3 sh.py stats")
    t.r("sqlite3 -readonly links.db 'SELECT * FROM links ORDER BY hits DESC, id'")
    t.sh("python3 sh.py add https://example.com/pricing && python3 sh.py open gd")
    t.sh("python3 sh.py stats | sort -k2,2nr -k1,1 > top.txt && cat top.txt")
    t.r("head -n 1 top.txt")
    t.r("python3 sh.py stats | head -n 1")
    t.r("grep -c . top.txt && ls -la && cat shortener.log")
    t.sh("python3 sh.py open ge; python3 sh.py stats | tail -n 2")
    t.verify = r"""
        set -e
        python3 sh.py stats | grep -qx 'g9 3 https://example.com/docs/checkpoint'
        head -n 1 top.txt | grep -qx 'g9 3 https://example.com/docs/checkpoint'
        test "$(sqlite3 links.db 'SELECT sum(hits) FROM links')" = 7
        """
    t.probe = "python3 sh.py stats"
    t.volatile = SERVER_VOLATILE
    return t


# ======================================================================== git
GIT_VOLATILE = [".git/index", ".git/logs/**", "**/__pycache__/**"]


@traj
def git_feature_merge():
    t = Traj("git-feature-merge", "git: feature branch, conflicting hotfix on main, merge, tag", "git")
    t.r("git --version && ls -la")
    t.sh("git init -q -b main && git config user.name agent && git config user.email agent@example.com && git status --short")
    t.write("greet.py", '''
        import sys


        def greet(name):
            return "Hello, %s!" % name


        if __name__ == "__main__":
            print(greet(sys.argv[1] if len(sys.argv) > 1 else "world"))
        ''')
    t.write("README.md", """
        # greet

        `python3 greet.py NAME`
        """)
    t.sh("git add -A && git commit -q -m 'Initial greet script' && git log --oneline")
    t.sh("git checkout -q -b feature/lang && git branch")
    t.write("greet.py", '''
        import sys

        GREETINGS = {"en": "Hello", "de": "Hallo", "fr": "Bonjour", "es": "Hola"}


        def greet(name, lang="en"):
            return "%s, %s!" % (GREETINGS[lang], name)


        if __name__ == "__main__":
            args = sys.argv[1:]
            lang = "en"
            if args and args[0].startswith("--lang="):
                lang = args.pop(0).split("=", 1)[1]
            print(greet(args[0] if args else "world", lang))
        ''')
    t.r("git diff --stat && python3 greet.py --lang=de Crab")
    t.sh("git commit -q -am 'Add --lang option' && git log --oneline")
    t.write("test_greet.py", '''
        import unittest

        from greet import greet


        class GreetTest(unittest.TestCase):
            def test_default(self):
                self.assertEqual(greet("x"), "Hello, x!")

            def test_lang(self):
                self.assertEqual(greet("x", "fr"), "Bonjour, x!")


        if __name__ == "__main__":
            unittest.main()
        ''')
    t.sh("python3 -m unittest -q test_greet 2>&1 | tail -n 1 && git add test_greet.py && git commit -q -m 'Add tests' && git log --oneline")
    t.sh("git checkout -q main && git log --oneline --all --graph")
    # hotfix on main: empty name handling (touches the same line region)
    t.write("greet.py", '''
        import sys


        def greet(name):
            name = name.strip() or "world"
            return "Hello, %s!" % name


        if __name__ == "__main__":
            print(greet(sys.argv[1] if len(sys.argv) > 1 else "world"))
        ''')
    t.r("python3 greet.py '  '")
    t.sh("git commit -q -am 'Fix: treat blank names as world' && git log --oneline")
    t.sh("sed -i 's/^`python3 greet.py NAME`$/`python3 greet.py [--lang=xx] NAME` (blank NAME greets the world)/' README.md && git commit -q -am 'Document usage' && git show --stat HEAD | tail -n 3")
    t.sh('git merge --no-ff -m "Merge branch \'feature/lang\'" feature/lang; echo "exit=$?"')
    t.r("git status --short && git diff --name-only --diff-filter=U")
    t.r("cat greet.py")
    t.write("greet.py", '''
        import sys

        GREETINGS = {"en": "Hello", "de": "Hallo", "fr": "Bonjour", "es": "Hola"}


        def greet(name, lang="en"):
            name = name.strip() or "world"
            return "%s, %s!" % (GREETINGS[lang], name)


        if __name__ == "__main__":
            args = sys.argv[1:]
            lang = "en"
            if args and args[0].startswith("--lang="):
                lang = args.pop(0).split("=", 1)[1]
            print(greet(args[0] if args else "world", lang))
        ''')
    t.sh("python3 -m unittest -q test_greet 2>&1 | tail -n 1 && python3 greet.py --lang=es ' '")
    t.sh("git add greet.py && git commit -q --no-edit && git log --oneline --graph")
    t.sh("""sed -i 's/^if __name__ == "__main__":$/    def test_blank(self):\\n        self.assertEqual(greet(" ", "de"), "Hallo, world!")\\n\\n\\nif __name__ == "__main__":/' test_greet.py && python3 -m unittest -v test_greet 2>&1 | tail -n 3""")
    t.r("git diff")
    t.sh("git commit -q -am 'Test blank names with --lang' && git tag -a v1.0 -m 'greet 1.0' && git tag -n")
    t.sh("git branch -d feature/lang && git branch")
    t.r("git log --oneline --graph --decorate")
    t.r("git log --format='%H %s' | head -n 3")
    t.r("git show v1.0 --stat | head -n 12")
    t.verify = r"""
        set -e
        test "$(git rev-list --count HEAD)" = 7
        test "$(git rev-list --merges --count HEAD)" = 1
        git describe --exact-match HEAD | grep -qx v1.0
        test -z "$(git status --porcelain)"
        test "$(git branch --format='%(refname:short)')" = main
        python3 greet.py --lang=fr ' ' | grep -qx 'Bonjour, world!'
        python3 -m unittest -q test_greet
        """
    t.volatile = GIT_VOLATILE
    return t


@traj
def git_rebase():
    t = Traj("git-rebase", "git: topic branch with fixups, autosquash rebase onto main, cherry-pick, tag", "git")
    t.r("ls -la && git --version")
    t.sh("git init -q -b main && git status")
    t.write("Makefile", """
        test:
        \t@sh tests.sh
        .PHONY: test
        """)
    t.write("lib.sh", r"""
        # shell helpers
        upper() { printf '%s\n' "$1" | tr a-z A-Z; }
        lower() { printf '%s\n' "$1" | tr A-Z a-z; }
        """)
    t.write("tests.sh", r"""
        . ./lib.sh
        fail=0
        eq() { if [ "$1" = "$2" ]; then echo "ok   $3"; else echo "FAIL $3: '$1' != '$2'"; fail=1; fi; }
        eq "$(upper abc)" ABC upper
        eq "$(lower ABC)" abc lower
        exit $fail
        """)
    t.sh("make test && git add . && git commit -q -m 'lib.sh with upper/lower and tests' && git log --oneline")
    t.sh("git checkout -q -b topic/strings")
    t.sh(r"""printf '%s\n' 'repeat() { n=$2; out=; while [ "$n" -gt 0 ]; do out="$out$1"; n=$((n - 1)); done; printf "%s\n" "$out"; }' >> lib.sh && tail -n 1 lib.sh""")
    t.sh(r"""sed -i 's/^exit \$fail$/eq "$(repeat ab 3)" ababab repeat\nexit $fail/' tests.sh && make test""")
    t.sh("git commit -q -am 'Add repeat' && git log --oneline")
    t.sh(r"""printf '%s\n' 'reverse() { printf "%s\n" "$1" | rev; }' >> lib.sh && sed -i 's/^exit \$fail$/eq "$(reverse abc)" cba reverse\nexit $fail/' tests.sh && make test; echo "exit=$?" """)
    t.r("which rev; dpkg -S bin/rev")
    t.sh("git commit -q -am 'Add reverse' && git log --oneline")
    # rev comes from util-linux (bsdextrautils): not in minimal images -> pure sed version
    t.sh(r"""sed -i 's/^reverse() .*$/reverse() { printf "%s\\n" "$1" | sed "\/\\n\/!G;s\/\\(.\\)\\(.*\\n\\)\/\&\\2\\1\/;\/\/D;s\/.\/\/"; }/' lib.sh && tail -n 1 lib.sh && make test""")
    t.sh("git commit -q -a --fixup=HEAD && git log --oneline")
    t.r("git log --format='%h %s' main..HEAD")
    # meanwhile on main
    t.sh("git checkout -q main")
    t.write("README", """
        lib.sh: small POSIX shell string helpers. Run `make test`.
        """)
    t.sh("git add README && git commit -q -m 'Add README' && git log --oneline --all --graph")
    t.sh(r"""sed -i 's/^# shell helpers$/# shell helpers (POSIX sh, no bashisms)/' lib.sh && git commit -q -am 'lib.sh: note POSIX' && git log --oneline""")
    t.sh("git checkout -q topic/strings && GIT_SEQUENCE_EDITOR=: git rebase -q -i --autosquash main && git log --oneline --graph --all")
    t.r("git log --format='%h %s' main..topic/strings")
    t.sh("make test")
    t.r("head -n 1 lib.sh && git diff main --stat")
    t.r("git show --stat HEAD~1 | tail -n 4")
    t.sh("git checkout -q main && git merge --ff-only topic/strings && git log --oneline")
    t.sh("git tag v0.2 && git branch -d topic/strings")
    # a stable branch gets a cherry-picked fix
    t.sh("git checkout -q -b stable v0.2 && git checkout -q main")
    t.sh(r"""sed -i 's/^upper() { printf .*$/upper() { printf '"'"'%s\\n'"'"' "$1" | tr '"'"'[:lower:]'"'"' '"'"'[:upper:]'"'"'; }/' lib.sh && sed -i 's/^lower() { printf .*$/lower() { printf '"'"'%s\\n'"'"' "$1" | tr '"'"'[:upper:]'"'"' '"'"'[:lower:]'"'"'; }/' lib.sh && head -n 3 lib.sh""")
    t.sh("make test && git commit -q -am 'Use character classes in upper/lower'")
    t.sh(r"""sed -i 's/^exit \$fail$/eq "$(upper "x-1")" X-1 upper-punct\nexit $fail/' tests.sh && make test && git commit -q -am 'Test punctuation in upper' && git log --oneline""")
    t.sh("git checkout -q stable && git cherry-pick -x main~1 && git log --oneline")
    t.r("git status --short; git log -1 --format=%B")
    t.sh("make test && git tag v0.2.1 && git checkout -q main")
    t.r("git log --oneline --graph --all --decorate")
    t.r("git tag && git rev-list --count main stable")
    t.r("git log --format='%an %ad %s' --date=iso main | head -n 3")
    t.verify = r"""
        set -e
        test "$(git rev-list --count main)" = 7
        test "$(git rev-list --count stable)" = 6
        test "$(git log --format=%s main | grep -c fixup)" = 0
        git log --format=%s v0.2 | head -n 2 | tr '\n' '|' | grep -qx 'Add reverse|Add repeat|'
        git show v0.2.1:lib.sh | grep -q ':lower:'
        ! git show v0.2:lib.sh | grep -q '| rev'
        test "$(git rev-parse --abbrev-ref HEAD)" = main
        make -s test | grep -c '^ok' | grep -qx 5
        """
    t.volatile = GIT_VOLATILE
    return t


UNITS = [("in", "cm", 2.54), ("ft", "m", 0.3048), ("mi", "km", 1.609344), ("lb", "kg", 0.45359237),
         ("oz", "g", 28.349523125), ("gal", "l", 3.785411784), ("yd", "m", 0.9144), ("mph", "kmh", 1.609344),
         ("nmi", "km", 1.852), ("acre", "m2", 4046.8564224), ("psi", "kpa", 6.894757), ("hp", "kw", 0.745699872)]


@traj
def git_release_tags():
    t = Traj("git-release-tags", "git: many small commits, annotated release tags, bisect a regression, revert, release branch", "git")
    t.r("ls -la && git --version")
    t.sh("git init -q -b main && git config tag.sort version:refname && git config --get tag.sort")
    t.write("conv.py", '''
        """Unit conversions: python3 conv.py VALUE FROM TO"""
        import sys

        FACTORS = {
            ("m", "cm"): 100.0,
        }


        def convert(value, src, dst):
            if (src, dst) in FACTORS:
                return value * FACTORS[(src, dst)]
            if (dst, src) in FACTORS:
                return value / FACTORS[(dst, src)]
            raise KeyError("no conversion %s -> %s" % (src, dst))


        if __name__ == "__main__":
            v, a, b = sys.argv[1:4]
            print("%.4f" % convert(float(v), a, b))
        ''')
    t.write("test_conv.py", '''
        import unittest

        from conv import FACTORS, convert

        KNOWN = {("in", "cm"): 2.54, ("ft", "m"): 0.3048, ("mi", "km"): 1.609344, ("lb", "kg"): 0.45359237,
                 ("oz", "g"): 28.349523125, ("gal", "l"): 3.785411784,
                 ("mph", "kmh"): 1.609344, ("nmi", "km"): 1.852, ("acre", "m2"): 4046.8564224,
                 ("psi", "kpa"): 6.894757, ("hp", "kw"): 0.745699872}


        class ConvTest(unittest.TestCase):
            def test_identity_pair(self):
                self.assertAlmostEqual(convert(2, "m", "cm"), 200)
                self.assertAlmostEqual(convert(50, "cm", "m"), 0.5)

            def test_known_factors(self):
                for pair, f in FACTORS.items():
                    if pair in KNOWN:
                        self.assertAlmostEqual(f, KNOWN[pair], places=6, msg=str(pair))

            def test_unknown(self):
                with self.assertRaises(KeyError):
                    convert(1, "m", "parsec")


        if __name__ == "__main__":
            unittest.main()
        ''')
    t.write("CHANGELOG.md", """
        # Changelog

        ## 0.1.0
        - m <-> cm
        """)
    t.sh("python3 -m unittest -q test_conv 2>&1 | tail -n 1 && git add -A && git commit -q -m 'conv 0.1.0' && git tag -a v0.1.0 -m 'Release 0.1.0'")
    t.r("git log --oneline --decorate && git tag -n")
    releases = {3: "0.2.0", 7: "0.3.0", 12: "0.4.0"}
    changelog = ["- m <-> cm"]
    pending = []
    for i, (a, b, f) in enumerate(UNITS, 1):
        shown = f
        if (a, b) == ("yd", "m"):
            shown = 0.9114  # typo: the regression bisect finds later
        t.sh(f"""sed -i 's/^}}$/    ("{a}", "{b}"): {shown!r},\\n}}/' conv.py && grep -n '"{a}"' conv.py""")
        if i % 3 == 1:
            t.r(f"python3 conv.py 10 {a} {b} && python3 conv.py 10 {b} {a}")
        t.sh("python3 -m unittest -q test_conv 2>&1 | tail -n 1")
        t.sh(f"git commit -q -am 'Add {a} -> {b}' && git log --oneline -1")
        pending.append(f"- {a} <-> {b}")
        if i in releases:
            ver = releases[i]
            entry = "## %s\\n%s\\n" % (ver, "\\n".join(pending))
            t.sh(f"""sed -i '2a\\\\n{entry}' CHANGELOG.md && sed -i '3{{/^$/d}}' CHANGELOG.md && head -n 12 CHANGELOG.md""")
            t.sh(f"git commit -q -am 'Release {ver}' && git tag -a v{ver} -m 'Release {ver}' && git describe")
            changelog = pending + changelog
            pending = []
    t.r("git tag -n && git log --oneline | wc -l")
    t.r("python3 conv.py 100 yd m && python3 -c 'print(100 * 0.9144)'")
    t.r("grep -n yd conv.py test_conv.py")
    t.write("check_yd.sh", """
        #!/bin/sh
        # bisect helper: good if yd is not there yet, or converts correctly
        grep -q '"yd"' conv.py || exit 0
        test "$(python3 conv.py 1 yd m)" = 0.9144
        """, mode="0755")
    t.r("./check_yd.sh; echo \"exit=$?\"")
    t.r("git log --oneline v0.2.0..HEAD | cat")
    t.sh("git bisect start HEAD v0.2.0 && git bisect run ./check_yd.sh > bisect.out 2>&1; grep 'is the first bad commit' bisect.out")
    t.r("git bisect log | tail -n 3; grep -A3 'first bad commit' bisect.out | tail -n 3")
    t.sh("git bisect reset; git status --short; rm bisect.out check_yd.sh")
    t.r("git log -S0.9114 --oneline")
    t.sh("git revert --no-edit $(git log --format=%h --grep='Add yd -> m') 2>&1 | tail -n 2; git status --short")
    t.r("git diff --name-only --diff-filter=U")
    t.sh("git revert --abort && git status --short && git log --oneline -1")
    t.sh(r"""sed -i 's/("yd", "m"): 0.9114,/("yd", "m"): 0.9144,/' conv.py && sed -i 's/("gal", "l"): 3.785411784,$/("gal", "l"): 3.785411784, ("yd", "m"): 0.9144,/' test_conv.py && git diff --stat""")
    t.sh("python3 -m unittest -q test_conv 2>&1 | tail -n 1 && git commit -q -am 'Fix yd -> m factor (typo 0.9114), test it' && git log --oneline -3")
    t.sh(r"""sed -i 's/^## 0.4.0$/## 0.4.1\n- fix yd <-> m factor\n\n## 0.4.0/' CHANGELOG.md && head -n 6 CHANGELOG.md""")
    t.sh("git commit -q -am 'Release 0.4.1' && git tag -a v0.4.1 -m 'Release 0.4.1' && git describe")
    # maintenance branch for 0.3 gets the fix too (0.9114 was introduced in 0.3.0)
    t.sh("git checkout -q -b release/0.3 v0.3.0 && grep -n yd conv.py")
    t.sh("git cherry-pick -x $(git log --format=%h --grep='Fix yd' main); echo \"exit=$?\"; git status --short")
    t.r("git diff conv.py")
    t.sh(r"""git checkout --ours conv.py && sed -i 's/("yd", "m"): 0.9114,/("yd", "m"): 0.9144,/' conv.py && git add conv.py && GIT_EDITOR=true git cherry-pick --continue && git log --oneline -2""")
    t.sh("python3 -m unittest -q test_conv 2>&1 | tail -n 1 && git show --stat HEAD | tail -n 3")
    t.sh(r"""sed -i 's/^## 0.3.0$/## 0.3.1\n- fix yd <-> m factor\n\n## 0.3.0/' CHANGELOG.md && git commit -q -am 'Release 0.3.1' && git tag -a v0.3.1 -m 'Release 0.3.1' && git describe""")
    t.sh("git checkout -q main && git branch -a")
    t.r("git log --oneline --graph --all --decorate | head -n 30")
    t.r("git tag -l 'v0.*' && git for-each-ref --format='%(refname:short) %(taggername) %(subject)' refs/tags")
    t.r("git shortlog -s -n --all")
    t.r("git log --format='%h %ad %s' --date=short -5")
    t.r("git describe --tags v0.3.1~1 && git describe --contains $(git log --format=%h --grep='Add psi')")
    t.r("cat CHANGELOG.md")
    t.r("python3 conv.py 3 hp kw && python3 conv.py 1 acre m2 && python3 conv.py 250 cm in")
    t.r("git diff v0.4.0 v0.4.1 --stat && git rev-list --count v0.1.0..main")
    t.r("git show v0.4.1 --no-patch --format='%(describe) %s' 2>/dev/null | head -n 1; git cat-file -t v0.4.1")
    t.r("git ls-files && git status --short --branch")
    t.verify = r"""
        set -e
        test "$(git tag | sort | tr '\n' ' ')" = "v0.1.0 v0.2.0 v0.3.0 v0.3.1 v0.4.0 v0.4.1 "
        test "$(git cat-file -t v0.3.1)" = tag
        git describe --exact-match main | grep -qx v0.4.1
        test "$(git rev-list --count main)" = 18
        test "$(git rev-list --count release/0.3)" = 12
        git show v0.3.1:conv.py | grep -q '("yd", "m"): 0.9144'
        git show v0.3.0:conv.py | grep -q '("yd", "m"): 0.9114'
        test "$(git rev-parse --abbrev-ref HEAD)" = main
        test ! -e .git/BISECT_LOG
        python3 -m unittest -q test_conv
        python3 conv.py 10 yd m | grep -qx 9.1440
        head -n 4 CHANGELOG.md | grep -qx '## 0.4.1'
        """
    t.volatile = GIT_VOLATILE
    return t


# ======================================================================= data
@traj
def data_sales():
    t = Traj("data-sales", "Sales CSV pipeline: generate, clean with awk, aggregate, sort, report", "data")
    t.r("ls -la && python3 --version && awk -W version 2>&1 | head -n 1")
    t.sh("mkdir -p raw stage out")
    t.write("gen_sales.py", '''
        """Writes raw/sales.csv: 400 deterministic rows with a few bad ones."""
        import csv
        import random

        rng = random.Random(20260101)
        regions = ["north", "south", "east", "west"]
        products = {"widget": 250, "gadget": 1299, "doohickey": 499, "gizmo": 3150}
        with open("raw/sales.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["order_id", "date", "region", "product", "qty", "unit_cents"])
            for i in range(1, 401):
                month = rng.randint(1, 6)
                day = rng.randint(1, 28)
                p = rng.choice(sorted(products))
                qty = rng.randint(1, 12)
                region = rng.choice(regions)
                if i % 57 == 0:
                    qty = -qty  # returns booked wrongly
                if i % 91 == 0:
                    region = ""
                w.writerow([i, "2025-%02d-%02d" % (month, day), region, p, qty, products[p]])
        ''')
    t.sh("python3 gen_sales.py && wc -l raw/sales.csv && head -n 5 raw/sales.csv")
    t.r("cut -d, -f3 raw/sales.csv | sort | uniq -c")
    t.r("awk -F, 'NR > 1 && $5 <= 0' raw/sales.csv")
    t.r("awk -F, 'NR > 1 && $3 == \"\"' raw/sales.csv | wc -l")
    t.sh("awk -F, 'NR == 1 || ($5 > 0 && $3 != \"\")' raw/sales.csv > stage/clean.csv && wc -l stage/clean.csv")
    t.sh("awk -F, 'NR > 1 && !($5 > 0 && $3 != \"\")' raw/sales.csv > stage/rejected.csv && wc -l stage/rejected.csv")
    t.write("aggregate.py", '''
        """stage/clean.csv -> stage/by_region_month.json and stage/by_product.csv"""
        import csv
        import json
        from collections import defaultdict

        rm = defaultdict(int)
        prod = defaultdict(lambda: [0, 0])
        with open("stage/clean.csv", newline="") as f:
            for r in csv.DictReader(f):
                cents = int(r["qty"]) * int(r["unit_cents"])
                rm[(r["region"], r["date"][:7])] += cents
                prod[r["product"]][0] += int(r["qty"])
                prod[r["product"]][1] += cents
        out = {}
        for (region, month), cents in sorted(rm.items()):
            out.setdefault(region, {})[month] = cents
        with open("stage/by_region_month.json", "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
        with open("stage/by_product.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["product", "units", "revenue_cents"])
            for p in sorted(prod):
                w.writerow([p] + prod[p])
        print(len(rm), "region-months,", len(prod), "products")
        ''')
    t.sh("python3 aggregate.py")
    t.r("head -c 400 stage/by_region_month.json; echo; cat stage/by_product.csv")
    t.sh("tail -n +2 stage/by_product.csv | sort -t, -k3,3nr > stage/products_ranked.csv && cat stage/products_ranked.csv")
    t.r("python3 -c \"import json; d=json.load(open('stage/by_region_month.json')); print({r: sum(m.values()) for r, m in d.items()})\"")
    t.write("report.py", '''
        """Builds out/report.md from the stage files."""
        import csv
        import json

        rm = json.load(open("stage/by_region_month.json"))
        months = sorted({m for r in rm.values() for m in r})
        lines = ["# Sales report H1 2025", "", "## Revenue by region and month (EUR)", ""]
        lines.append("| region | " + " | ".join(months) + " | total |")
        lines.append("|---" * (len(months) + 2) + "|")
        grand = 0
        for region in sorted(rm):
            vals = [rm[region].get(m, 0) for m in months]
            grand += sum(vals)
            lines.append("| %s | %s | %.2f |" % (region, " | ".join("%.2f" % (v / 100) for v in vals), sum(vals) / 100))
        lines += ["", "Grand total: %.2f EUR" % (grand / 100), "", "## Products by revenue", ""]
        with open("stage/products_ranked.csv", newline="") as f:
            for i, (p, units, cents) in enumerate(csv.reader(f), 1):
                lines.append("%d. %s: %s units, %.2f EUR" % (i, p, units, int(cents) / 100))
        rejected = sum(1 for _ in open("stage/rejected.csv"))
        lines += ["", "Rejected rows: %d (see stage/rejected.csv)" % rejected, ""]
        open("out/report.md", "w").write("\\n".join(lines))
        print("\\n".join(lines))
        ''')
    t.sh("python3 report.py")
    t.r("grep 'Grand total' out/report.md")
    t.r("awk -F, 'NR > 1 {s += $5 * $6} END {printf \"%.2f\\n\", s / 100}' stage/clean.csv")
    t.sh("sed -i 's/^# Sales report H1 2025$/# Sales report H1 2025 (net of rejected rows)/' out/report.md && head -n 1 out/report.md")
    t.r("ls -la raw stage out && md5sum stage/* out/*")
    t.r("cut -d, -f2 stage/clean.csv | cut -c1-7 | sort | uniq -c")
    t.r("python3 -c \"import csv; rows = list(csv.DictReader(open('stage/clean.csv'))); print(len(rows), min(int(r['qty']) for r in rows))\"")
    t.r("wc -l stage/*.csv && cat out/report.md | tail -n 8")
    t.verify = r"""
        set -e
        test -s out/report.md
        total=$(awk -F, 'NR > 1 {s += $5 * $6} END {printf "%.2f", s / 100}' stage/clean.csv)
        grep -qx "Grand total: $total EUR" out/report.md
        test "$(wc -l < stage/rejected.csv)" = 11
        test "$(($(wc -l < stage/clean.csv) + $(wc -l < stage/rejected.csv)))" = 401
        head -n 1 out/report.md | grep -q 'net of rejected'
        """
    return t


@traj
def data_logs():
    t = Traj("data-logs", "Access-log analysis in stages: parse, filter, aggregate, percentiles, report", "data")
    t.r("ls -la")
    t.write("mklogs.py", '''
        """Writes logs/access-{1,2,3}.log in a common-log-like format (deterministic)."""
        import os
        import random

        rng = random.Random(7)
        paths = ["/", "/api/items", "/api/items/42", "/api/login", "/static/app.js", "/api/search", "/health"]
        weights = [5, 20, 10, 4, 12, 8, 6]
        ips = ["10.0.0.%d" % i for i in range(1, 23)]
        os.makedirs("logs", exist_ok=True)
        sec = 0
        for part in (1, 2, 3):
            with open("logs/access-%d.log" % part, "w") as f:
                for _ in range(700):
                    sec += rng.randint(1, 60)
                    p = rng.choices(paths, weights)[0]
                    status = rng.choices([200, 304, 404, 500], [85, 8, 5, 2])[0]
                    if p == "/api/login" and rng.random() < 0.3:
                        status = 401
                    ms = int(rng.lognormvariate(3.2, 0.8)) + (400 if p == "/api/search" else 0)
                    ts = "2025-03-%02d %02d:%02d:%02d" % (1 + sec // 86400, sec // 3600 % 24, sec // 60 % 60, sec % 60)
                    f.write('%s [%s] "GET %s" %d %d\\n' % (rng.choice(ips), ts, p, status, ms))
        ''')
    t.sh("python3 mklogs.py && ls -la logs && head -n 3 logs/access-1.log")
    t.r("wc -l logs/*.log")
    t.r("tail -n 2 logs/access-3.log")
    t.sh("mkdir -p work && cat logs/access-*.log > work/all.log && wc -l work/all.log")
    t.r("awk '{print $5}' work/all.log | sort | uniq -c | sort -rn")
    t.sh("""sed -E 's/^([0-9.]+) \\[([0-9-]+) ([0-9:]+)\\] "GET ([^"]+)" ([0-9]+) ([0-9]+)$/\\1\\t\\2\\t\\3\\t\\4\\t\\5\\t\\6/' work/all.log > work/all.tsv && head -n 3 work/all.tsv""")
    t.r("awk -F'\\t' 'NF != 6' work/all.tsv | wc -l")
    t.sh("awk -F'\\t' '{c[$4]++; s[$4] += $6} END {for (p in c) printf \"%s\\t%d\\t%.1f\\n\", p, c[p], s[p] / c[p]}' work/all.tsv | sort -t\"$(printf '\\t')\" -k2,2nr > work/by_path.tsv && cat work/by_path.tsv")
    t.sh("awk -F'\\t' '$5 >= 500' work/all.tsv > work/errors.tsv && wc -l < work/errors.tsv")
    t.r("cut -f4 work/errors.tsv | sort | uniq -c | sort -rn")
    t.sh("awk -F'\\t' '$5 == 401 {print $1}' work/all.tsv | sort | uniq -c | sort -k1,1nr -k2 > work/auth_fail_by_ip.txt && head -n 5 work/auth_fail_by_ip.txt")
    t.sh("awk -F'\\t' '{split($3, a, \":\"); h[$2 \" \" a[1]]++} END {for (k in h) print k \"\\t\" h[k]}' work/all.tsv | sort > work/per_hour.tsv && wc -l work/per_hour.tsv && head -n 4 work/per_hour.tsv")
    t.r("sort -t\"$(printf '\\t')\" -k3,3nr work/per_hour.tsv | head -n 3")
    t.write("percentiles.py", '''
        """Latency percentiles per path from work/all.tsv -> work/latency.json"""
        import json
        from collections import defaultdict

        lat = defaultdict(list)
        for line in open("work/all.tsv"):
            ip, day, tm, path, status, ms = line.rstrip("\\n").split("\\t")
            lat[path].append(int(ms))


        def pct(xs, p):
            xs = sorted(xs)
            k = max(0, min(len(xs) - 1, int(round(p / 100 * len(xs) + 0.5)) - 1))
            return xs[k]


        out = {p: {"n": len(v), "p50": pct(v, 50), "p90": pct(v, 90), "p99": pct(v, 99), "max": max(v)}
               for p, v in sorted(lat.items())}
        json.dump(out, open("work/latency.json", "w"), indent=1, sort_keys=True)
        for p, s in out.items():
            print("%-16s n=%4d p50=%4d p90=%4d p99=%4d" % (p, s["n"], s["p50"], s["p90"], s["p99"]))
        ''')
    t.sh("python3 percentiles.py")
    t.r("python3 -c \"import json; d = json.load(open('work/latency.json')); print(max(d, key=lambda p: d[p]['p90']))\"")
    t.r("awk -F'\\t' '$4 == \"/api/search\" {print $6}' work/all.tsv | sort -n | awk '{a[NR] = $1} END {print a[int(NR / 2)], a[NR]}'")
    t.write("report.py", '''
        import json

        lat = json.load(open("work/latency.json"))
        by_path = [l.rstrip("\\n").split("\\t") for l in open("work/by_path.tsv")]
        errors = sum(1 for _ in open("work/errors.tsv"))
        total = sum(int(c) for _, c, _ in by_path)
        auth = [l.split() for l in open("work/auth_fail_by_ip.txt")]
        busiest = max((l.rstrip("\\n").split("\\t") for l in open("work/per_hour.tsv")), key=lambda r: (int(r[2]), r[0]))
        out = ["ACCESS LOG REPORT", "=================", "requests: %d" % total,
               "5xx errors: %d (%.2f%%)" % (errors, 100 * errors / total),
               "busiest hour: %s:00 (%s requests)" % (busiest[0], busiest[1]), "",
               "path              hits  avg_ms  p90_ms"]
        for path, c, avg in by_path:
            out.append("%-16s %5s %7s %7d" % (path, c, avg, lat[path]["p90"]))
        out += ["", "top 401 sources:"] + ["  %s x%s" % (ip, n) for n, ip in auth[:3]]
        open("report.txt", "w").write("\\n".join(out) + "\\n")
        print("\\n".join(out))
        ''')
    t.sh("python3 report.py; echo \"exit=$?\"")
    t.r("head -n 2 work/per_hour.tsv | od -c | head -n 4")
    t.write("report.py", '''
        import json

        lat = json.load(open("work/latency.json"))
        by_path = [l.rstrip("\\n").split("\\t") for l in open("work/by_path.tsv")]
        errors = sum(1 for _ in open("work/errors.tsv"))
        total = sum(int(c) for _, c, _ in by_path)
        auth = [l.split() for l in open("work/auth_fail_by_ip.txt")]
        busiest = max((l.rstrip("\\n").split("\\t") for l in open("work/per_hour.tsv")), key=lambda r: (int(r[1]), r[0]))
        out = ["ACCESS LOG REPORT", "=================", "requests: %d" % total,
               "5xx errors: %d (%.2f%%)" % (errors, 100 * errors / total),
               "busiest hour: %s:00 (%s requests)" % (busiest[0], busiest[1]), "",
               "path              hits  avg_ms  p90_ms"]
        for path, c, avg in by_path:
            out.append("%-16s %5s %7s %7d" % (path, c, avg, lat[path]["p90"]))
        out += ["", "top 401 sources:"] + ["  %s x%s" % (ip, n) for n, ip in auth[:3]]
        open("report.txt", "w").write("\\n".join(out) + "\\n")
        print("\\n".join(out))
        ''')
    t.sh("python3 report.py")
    t.r("cat work/per_hour.tsv | sort -t\"$(printf '\\t')\" -k2,2nr | head -n 2")
    t.r("grep -c . report.txt && grep '^requests' report.txt")
    t.sh("tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - work | gzip -n -9 > work.tar.gz && tar -tzf work.tar.gz && rm -f work/all.log")
    t.r("ls -la . work && du -sh work")
    t.verify = r"""
        set -e
        grep -qx 'requests: 2100' report.txt
        test "$(wc -l < work/all.tsv)" = 2100
        test ! -e work/all.log
        n=$(awk -F'\t' '$5 >= 500' work/all.tsv | wc -l)
        grep -q "^5xx errors: $n " report.txt
        python3 -c "import json; d = json.load(open('work/latency.json')); assert d['/api/search']['p50'] > d['/health']['p50']"
        tar -tzf work.tar.gz | grep -qx work/all.log
        """
    return t


STUDENTS = ["Ada", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
            "Max", "Nia", "Oto", "Pia"]
COURSES = ["algebra", "biology", "chemistry", "drama", "economics"]


@traj
def data_grades():
    t = Traj("data-grades", "Grades: join JSON roster and CSV scores, GPA, ranking, per-course stats, sqlite cross-check", "data")
    t.r("ls -la")
    t.sh("mkdir -p input build report")
    roster = [{"id": 100 + i, "name": n, "year": 1 + i % 3} for i, n in enumerate(STUDENTS)]
    t.write("input/roster.json", json.dumps(roster, indent=1) + "\n")
    rng = random.Random(99)
    rows = ["student_id,course,score"]
    for s in roster:
        for c in COURSES:
            if rng.random() < 0.85:
                rows.append("%d,%s,%d" % (s["id"], c, rng.randint(38, 100)))
    rows.append("999,algebra,77")
    rows.append("105,drama,")
    t.write("input/scores.csv", "\n".join(rows) + "\n")
    t.r("head -n 5 input/scores.csv && wc -l input/scores.csv")
    t.r("python3 -c \"import json; r = json.load(open('input/roster.json')); print(len(r), r[0])\"")
    t.r("cut -d, -f2 input/scores.csv | tail -n +2 | sort | uniq -c")
    t.r("awk -F, 'NR > 1 && $3 == \"\"' input/scores.csv")
    t.r("python3 -c \"import json; ids = {s['id'] for s in json.load(open('input/roster.json'))}; import csv; print([r for r in csv.DictReader(open('input/scores.csv')) if int(r['student_id']) not in ids])\"")
    t.write("join.py", '''
        """input/* -> build/joined.csv (valid rows only) and build/problems.txt"""
        import csv
        import json

        roster = {s["id"]: s for s in json.load(open("input/roster.json"))}
        problems = []
        with open("input/scores.csv", newline="") as f, open("build/joined.csv", "w", newline="") as out:
            w = csv.writer(out)
            w.writerow(["id", "name", "year", "course", "score"])
            for n, r in enumerate(csv.DictReader(f), 2):
                sid = int(r["student_id"])
                if sid not in roster:
                    problems.append("line %d: unknown student %d" % (n, sid))
                    continue
                if not r["score"].strip():
                    problems.append("line %d: missing score for %d/%s" % (n, sid, r["course"]))
                    continue
                s = roster[sid]
                w.writerow([sid, s["name"], s["year"], r["course"], int(r["score"])])
        open("build/problems.txt", "w").write("".join(p + "\\n" for p in problems))
        print(len(problems), "problems")
        ''')
    t.sh("python3 join.py && cat build/problems.txt && wc -l build/joined.csv")
    t.write("grades.py", '''
        """build/joined.csv -> build/students.csv (avg, gpa, letter) sorted by rank"""
        import csv
        from collections import defaultdict


        def letter(score):
            for cut, l in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):
                if score >= cut:
                    return l
            return "F"


        POINTS = {"A": 4.0, "B": 3.0, "C": 2.0, "D": 1.0, "F": 0.0}
        per = defaultdict(list)
        names = {}
        for r in csv.DictReader(open("build/joined.csv")):
            per[int(r["id"])].append(int(r["score"]))
            names[int(r["id"])] = r["name"]
        rows = []
        for sid, sc in per.items():
            avg = sum(sc) / len(sc)
            gpa = sum(POINTS[letter(s)] for s in sc) / len(sc)
            rows.append((sid, names[sid], len(sc), round(avg, 2), round(gpa, 2), letter(avg)))
        rows.sort(key=lambda r: (-r[4], -r[3], r[0]))
        with open("build/students.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["rank", "id", "name", "courses", "avg", "gpa", "letter"])
            for i, r in enumerate(rows, 1):
                w.writerow([i] + list(r))
        print(len(rows), "students")
        ''')
    t.sh("python3 grades.py && column -t -s, build/students.csv 2>/dev/null || cat build/students.csv")
    t.r("head -n 4 build/students.csv")
    t.r("awk -F, 'NR > 1 {print $7}' build/students.csv | sort | uniq -c")
    t.write("courses.py", '''
        """build/joined.csv -> build/courses.json: n, mean, median, min, max, stdev, pass rate"""
        import csv
        import json
        import statistics
        from collections import defaultdict

        by = defaultdict(list)
        for r in csv.DictReader(open("build/joined.csv")):
            by[r["course"]].append(int(r["score"]))
        out = {}
        for c in sorted(by):
            s = by[c]
            out[c] = {"n": len(s), "mean": round(statistics.mean(s), 2), "median": statistics.median(s),
                      "min": min(s), "max": max(s), "stdev": round(statistics.pstdev(s), 2),
                      "pass_rate": round(sum(x >= 60 for x in s) / len(s), 3)}
        json.dump(out, open("build/courses.json", "w"), indent=1, sort_keys=True)
        print(json.dumps(out, indent=1, sort_keys=True))
        ''')
    t.sh("python3 courses.py")
    t.r("python3 -c \"import json; d = json.load(open('build/courses.json')); print(sorted(d, key=lambda c: d[c]['mean']))\"")
    # cross-check with sqlite
    t.sh("rm -f build/check.db && sqlite3 build/check.db '.mode csv' '.import build/joined.csv joined' 'SELECT count(*) FROM joined'")
    t.r("sqlite3 build/check.db 'SELECT course, count(*), round(avg(score), 2), min(score), max(score) FROM joined GROUP BY course ORDER BY course'")
    t.r("python3 -c \"import json; d = json.load(open('build/courses.json')); [print(c, v['n'], v['mean'], v['min'], v['max']) for c, v in d.items()]\"")
    t.r("sqlite3 build/check.db \"SELECT name, round(avg(score), 2) AS a FROM joined GROUP BY id ORDER BY a DESC LIMIT 3\"")
    t.r("awk -F, 'NR > 1 && NR <= 4 {print $3, $5}' build/students.csv")
    # histogram
    t.sh("""awk -F, 'NR > 1 {b = int($5 / 10) * 10; if (b == 100) b = 90; h[b]++} END {for (k in h) print k}' build/joined.csv | sort -n | while read b; do printf '%3d-%3d ' $b $((b + 9)); awk -F, -v b=$b 'NR > 1 {x = int($5 / 10) * 10; if (x == 100) x = 90; if (x == b) n++} END {s = ""; for (i = 0; i < n; i++) s = s "#"; print s " " n}' build/joined.csv; done > build/histogram.txt && cat build/histogram.txt""")
    t.r("awk '{s += $NF} END {print s}' build/histogram.txt && tail -n +2 build/joined.csv | wc -l")
    t.write("report.py", '''
        import csv
        import json

        students = list(csv.DictReader(open("build/students.csv")))
        courses = json.load(open("build/courses.json"))
        problems = open("build/problems.txt").read().splitlines()
        out = ["# Term report", "", "## Top 5", ""]
        for s in students[:5]:
            out.append("%s. %s (GPA %s, avg %s, %s)" % (s["rank"], s["name"], s["gpa"], s["avg"], s["letter"]))
        out += ["", "## Courses", "", "| course | n | mean | median | pass |", "|---|---|---|---|---|"]
        for c, v in courses.items():
            out.append("| %s | %d | %.2f | %s | %.0f%% |" % (c, v["n"], v["mean"], v["median"], v["pass_rate"] * 100))
        out += ["", "## Score distribution", "", "```"] + open("build/histogram.txt").read().splitlines() + ["```"]
        out += ["", "## Data problems (%d)" % len(problems), ""] + ["- " + p for p in problems]
        open("report/term.md", "w").write("\\n".join(out) + "\\n")
        print("\\n".join(out))
        ''')
    t.sh("python3 report.py")
    t.r("grep -n 'Data problems' report/term.md && wc -l report/term.md")
    t.sh("cp build/students.csv report/ranking.csv && ls -la report")
    t.r("cmp build/students.csv report/ranking.csv && echo same")
    t.r("sed -n '1,12p' report/term.md")
    t.verify = r"""
        set -e
        test "$(grep -c 'unknown student\|missing score' build/problems.txt)" = 2
        test "$(sqlite3 build/check.db 'SELECT count(*) FROM joined')" = "$(tail -n +2 build/joined.csv | wc -l)"
        head -n 2 report/ranking.csv | tail -n 1 | cut -d, -f1 | grep -qx 1
        grep -q '^## Top 5' report/term.md
        python3 -c "import json; d = json.load(open('build/courses.json')); assert sorted(d) == ['algebra', 'biology', 'chemistry', 'drama', 'economics']"
        test "$(awk '{s += $NF} END {print s}' build/histogram.txt)" = "$(tail -n +2 build/joined.csv | wc -l)"
        """
    return t


# ======================================================================= repl
REPL_VOLATILE = ["*.sock", "*.log", "*.pid", "**/__pycache__/**"]

KVD = r'''
"""kvd: in-memory key-value daemon on a unix socket (state is NOT persisted).

protocol: one request line per connection, one reply
  SET k v | GET k | DEL k | INCR k [n] | APPEND k v | KEYS [prefix] | DUMP
"""
import json
import os
import socket
import sys

PATH = sys.argv[1] if len(sys.argv) > 1 else "kv.sock"
data = {}


def handle(line):
    parts = line.split(" ", 2)
    cmd = parts[0].upper()
    if cmd == "SET" and len(parts) == 3:
        data[parts[1]] = parts[2]
        return "OK"
    if cmd == "GET" and len(parts) == 2:
        return data.get(parts[1], "(nil)")
    if cmd == "DEL" and len(parts) == 2:
        return str(int(data.pop(parts[1], None) is not None))
    if cmd == "INCR" and len(parts) >= 2:
        n = int(data.get(parts[1], "0")) + (int(parts[2]) if len(parts) == 3 else 1)
        data[parts[1]] = str(n)
        return str(n)
    if cmd == "APPEND" and len(parts) == 3:
        data[parts[1]] = data.get(parts[1], "") + parts[2]
        return str(len(data[parts[1]]))
    if cmd == "KEYS":
        prefix = parts[1] if len(parts) > 1 else ""
        return "\n".join(sorted(k for k in data if k.startswith(prefix)))
    if cmd == "DUMP":
        return json.dumps(data, indent=1, sort_keys=True)
    return "ERR bad command"


if os.path.exists(PATH):
    os.unlink(PATH)
srv = socket.socket(socket.AF_UNIX)
srv.bind(PATH)
srv.listen(8)
print("kvd listening on", PATH, flush=True)
while True:
    conn, _ = srv.accept()
    with conn:
        try:
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buf += chunk
            if buf:  # an empty connection is a readiness probe
                conn.sendall((handle(buf.decode().rstrip("\n")) + "\n").encode())
        except OSError as e:
            print("client error:", e, flush=True)
'''

KV_CLIENT = r'''
"""usage: python3 kv.py COMMAND [ARGS...]   (talks to kvd on ./kv.sock)"""
import socket
import sys

s = socket.socket(socket.AF_UNIX)
s.connect("kv.sock")
s.sendall((" ".join(sys.argv[1:]) + "\n").encode())
out = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    out += chunk
sys.stdout.write(out.decode())
'''


@traj
def repl_kv():
    t = Traj("repl-kv", "In-memory key-value daemon on a unix socket, filled and edited by many turns", "repl")
    t.r("ls -la")
    t.write("kvd.py", KVD)
    t.write("kv.py", KV_CLIENT)
    t.sh("nohup python3 kvd.py kv.sock </dev/null >kvd.log 2>&1 &\necho $! > kvd.pid\n" + wait_sock("kv.sock"))
    t.r("cat kvd.log && python3 kv.py KEYS")
    cfg = [("svc:api:port", "8080"), ("svc:api:replicas", "2"), ("svc:worker:replicas", "3"),
           ("svc:worker:queue", "jobs"), ("svc:db:host", "db.internal"), ("svc:db:pool", "10")]
    for k, v in cfg:
        t.sh(f"python3 kv.py SET {k} {v}")
    t.r("python3 kv.py KEYS svc:")
    t.r("python3 kv.py GET svc:api:port && python3 kv.py GET svc:api:host")
    t.sh("python3 kv.py INCR svc:api:replicas 2")
    t.sh("python3 kv.py INCR deploys && python3 kv.py INCR deploys")
    t.write("services.txt", """
        api     8080 4
        worker  -    3
        cron    -    1
        mailer  2525 1
        """)
    t.sh("while read name port replicas; do python3 kv.py SET svc:$name:replicas $replicas; [ \"$port\" = - ] || python3 kv.py SET svc:$name:port $port; done < services.txt")
    t.r("python3 kv.py KEYS svc: | wc -l && python3 kv.py KEYS svc:mailer")
    t.sh("python3 kv.py DEL svc:db:host && python3 kv.py DEL svc:db:host")
    t.sh("python3 kv.py SET svc:db:host db-primary.internal")
    t.r("python3 kv.py DUMP")
    for i, ev in enumerate(["deploy api", "scale worker", "restart cron", "deploy mailer", "rollback api"]):
        t.sh(f"python3 kv.py APPEND audit '{ev};' && python3 kv.py INCR events")
    t.r("python3 kv.py GET audit | tr ';' '\\n'")
    t.r("python3 kv.py BOGUS x")
    t.write("export.py", '''
        """Write the service table from kvd to services.json (the daemon stays the source of truth)."""
        import json
        import subprocess

        keys = subprocess.run(["python3", "kv.py", "KEYS", "svc:"], capture_output=True, text=True).stdout.split()
        table = {}
        for k in keys:
            _, name, field = k.split(":")
            v = subprocess.run(["python3", "kv.py", "GET", k], capture_output=True, text=True).stdout.strip()
            table.setdefault(name, {})[field] = int(v) if v.isdigit() else v
        json.dump(table, open("services.json", "w"), indent=1, sort_keys=True)
        print(json.dumps(table, sort_keys=True))
        ''')
    t.sh("python3 export.py")
    t.r("python3 -c \"import json; t = json.load(open('services.json')); print(sum(s.get('replicas', 0) for s in t.values()))\"")
    t.sh("python3 kv.py SET total_replicas $(python3 -c \"import json; t = json.load(open('services.json')); print(sum(s.get('replicas', 0) for s in t.values()))\")")
    t.sh("python3 kv.py INCR svc:worker:replicas -1 && python3 kv.py INCR deploys")
    t.r("python3 kv.py KEYS && python3 kv.py GET deploys")
    t.verify = r"""
        set -e
        test "$(python3 kv.py GET svc:api:replicas)" = 4
        test "$(python3 kv.py GET svc:worker:replicas)" = 2
        test "$(python3 kv.py GET deploys)" = 3
        test "$(python3 kv.py GET events)" = 5
        test "$(python3 kv.py GET total_replicas)" = 9
        python3 kv.py GET audit | grep -qx 'deploy api;scale worker;restart cron;deploy mailer;rollback api;'
        test "$(python3 kv.py GET svc:db:host)" = db-primary.internal
        """
    t.probe = "python3 kv.py DUMP"
    t.volatile = REPL_VOLATILE
    return t


STATD = r'''
"""statd: keeps numeric series in memory and answers statistics (unix socket ./stat.sock).

request (one line): PUSH series v [v ...] | STATS series | TOP series n | RESET series | SERIES | DUMP
"""
import json
import os
import socket
import statistics

series = {}


def stats(xs):
    return {"n": len(xs), "sum": round(sum(xs), 6), "mean": round(statistics.fmean(xs), 6),
            "min": min(xs), "max": max(xs), "median": statistics.median(xs)}


def handle(words):
    cmd, args = words[0].upper(), words[1:]
    if cmd == "PUSH":
        xs = series.setdefault(args[0], [])
        xs.extend(float(v) for v in args[1:])
        return "%s n=%d" % (args[0], len(xs))
    if cmd == "STATS":
        if args[0] not in series:
            return "ERR no series " + args[0]
        return json.dumps(stats(series[args[0]]), sort_keys=True)
    if cmd == "TOP":
        return " ".join("%g" % v for v in sorted(series.get(args[0], []), reverse=True)[: int(args[1])])
    if cmd == "RESET":
        return "dropped %d" % len(series.pop(args[0], []))
    if cmd == "SERIES":
        return " ".join(sorted(series))
    if cmd == "DUMP":
        return json.dumps({k: {"values": v, "stats": stats(v)} for k, v in series.items() if v}, indent=1, sort_keys=True)
    return "ERR unknown " + cmd


if os.path.exists("stat.sock"):
    os.unlink("stat.sock")
srv = socket.socket(socket.AF_UNIX)
srv.bind("stat.sock")
srv.listen(8)
while True:
    c, _ = srv.accept()
    with c:
        try:
            f = c.makefile("rwb")
            line = f.readline().decode().split()
            if not line:
                continue  # readiness probe
            try:
                reply = handle(line)
            except (ValueError, IndexError) as e:
                reply = "ERR " + str(e)
            f.write((reply + "\n").encode())
            f.close()  # the socket only really closes once its file is closed too
        except OSError as e:
            print("client error:", e, flush=True)
'''


@traj
def repl_stats():
    t = Traj("repl-stats", "Statistics daemon holding numeric series in memory, fed by many measurement turns", "repl")
    t.r("ls -la && python3 -c 'import statistics; print(statistics.fmean([1, 2]))'")
    t.write("statd.py", STATD)
    t.write("st", r"""
        #!/bin/sh
        # st CMD ARGS... -- one request to statd
        exec python3 -c '
        import socket, sys
        s = socket.socket(socket.AF_UNIX); s.connect("stat.sock")
        s.sendall((" ".join(sys.argv[1:]) + "\n").encode())
        print(s.makefile().read(), end="")
        ' "$@"
        """, mode="0755")
    t.sh("nohup python3 statd.py </dev/null >statd.log 2>&1 &\necho $! > statd.pid\n" + wait_sock("stat.sock"))
    t.r("./st SERIES; ./st STATS nothing")
    # measurements the agent takes: sizes of files it creates, timings replaced by deterministic counts
    t.write("fib.py", '''
        import sys


        def fib_calls(n):
            calls = 0

            def f(k):
                nonlocal calls
                calls += 1
                return k if k < 2 else f(k - 1) + f(k - 2)

            return f(n), calls


        n = int(sys.argv[1])
        print(*fib_calls(n))
        ''')
    for n in range(5, 21, 3):
        t.sh(f"set -- $(python3 fib.py {n}) && ./st PUSH fib_value $1 && ./st PUSH fib_calls $2")
    t.r("./st STATS fib_calls && ./st TOP fib_calls 3")
    t.r("./st SERIES")
    t.sh("mkdir -p data && for i in 1 2 3 4 5 6 7 8; do python3 -c \"print('x' * ($i * 37 % 101) * $i)\" > data/f$i.txt; done && wc -c data/*.txt")
    t.sh("./st PUSH file_bytes $(wc -c data/*.txt | awk '$2 != \"total\" {print $1}')")
    t.r("./st STATS file_bytes")
    t.sh("./st PUSH loc $(wc -l < statd.py) $(wc -l < fib.py) $(wc -l < st)")
    t.r("./st STATS loc")
    t.write("words.txt", """
        the quick brown fox jumps over the lazy dog
        pack my box with five dozen liquor jugs
        how vexingly quick daft zebras jump
        sphinx of black quartz judge my vow
        """)
    t.sh("./st PUSH word_len $(tr ' ' '\\n' < words.txt | awk 'length > 0 {print length}')")
    t.r("./st STATS word_len && ./st TOP word_len 5")
    t.r("awk '{for (i = 1; i <= NF; i++) {s += length($i); n++}} END {print s / n, n}' words.txt")
    for line in range(1, 5):
        t.sh(f"./st PUSH line_words $(sed -n '{line}p' words.txt | wc -w)")
    t.r("./st STATS line_words")
    t.sh("./st PUSH word_len abc; ./st STATS word_len | python3 -c 'import json, sys; print(json.load(sys.stdin)[\"n\"])'")
    t.sh("./st RESET fib_value && ./st SERIES")
    t.r("./st STATS fib_value")
    for n in (10, 20, 25):
        t.sh(f"./st PUSH fib_value $(python3 fib.py {n} | cut -d' ' -f1)")
    t.r("./st STATS fib_value")
    t.write("summarize.py", '''
        """Writes summary.txt from the daemon's current statistics."""
        import json
        import subprocess


        def st(*args):
            return subprocess.run(["./st"] + list(args), capture_output=True, text=True, check=True).stdout.strip()


        lines = []
        for name in st("SERIES").split():
            s = json.loads(st("STATS", name))
            lines.append("%-11s n=%-3d mean=%-12.3f median=%-9g min=%-7g max=%g" % (name, s["n"], s["mean"], s["median"], s["min"], s["max"]))
        open("summary.txt", "w").write("\\n".join(lines) + "\\n")
        print("\\n".join(lines))
        ''')
    t.sh("python3 summarize.py")
    t.r("cat summary.txt | wc -l")
    t.sh("./st PUSH loc $(wc -l < summarize.py) && python3 summarize.py | grep '^loc'")
    t.r("./st DUMP | head -n 20")
    t.verify = r"""
        set -e
        test "$(./st SERIES)" = "fib_calls fib_value file_bytes line_words loc word_len"
        ./st STATS fib_value | grep -q '"sum": 81845.0'
        ./st STATS fib_calls | grep -q '"n": 6'
        ./st STATS line_words | grep -q '"mean": 7.5'
        grep -q '^loc ' summary.txt
        test "$(grep -c . summary.txt)" = 6
        """
    t.probe = "./st DUMP"
    t.volatile = REPL_VOLATILE
    return t


KERNEL = r'''
"""kernel.py: a persistent Python namespace served on ./kernel.sock (like a notebook kernel).

A client sends code and closes its write side; the kernel runs it in one long-lived
namespace (a final expression is echoed like in the REPL) and sends back the output.
The special request %vars dumps the plain-data variables as JSON. Nothing is saved to disk.
"""
import ast
import contextlib
import io
import json
import os
import socket
import traceback
import types

ns = {"__name__": "__kernel__"}
count = 0


def plain(v):
    if isinstance(v, (bool, int, float, str, type(None))):
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        return sorted((plain(x) for x in v), key=repr)
    if isinstance(v, (types.FunctionType, types.ModuleType, type)):
        return "<%s %s>" % (type(v).__name__, getattr(v, "__name__", "?"))
    if hasattr(v, "__dict__"):
        d = {"__class__": type(v).__name__}
        d.update((k, plain(x)) for k, x in vars(v).items())
        return d
    return "<%s>" % type(v).__name__


def run(code):
    global count
    count += 1
    if code.strip() == "%vars":
        return json.dumps({k: plain(v) for k, v in ns.items() if not k.startswith("_")}, indent=1, sort_keys=True) + "\n"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            tree = ast.parse(code, "<cell %d>" % count)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<cell %d>" % count, "exec"), ns)
            if last is not None:
                r = eval(compile(last, "<cell %d>" % count, "eval"), ns)
                if r is not None:
                    print(repr(r))
        except Exception as e:
            # drop the kernel's own frame, keep the cell frames
            print("".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next)), end="")
    return out.getvalue()


if os.path.exists("kernel.sock"):
    os.unlink("kernel.sock")
srv = socket.socket(socket.AF_UNIX)
srv.bind("kernel.sock")
srv.listen(4)
print("kernel ready", flush=True)
while True:
    conn, _ = srv.accept()
    with conn:
        try:
            data = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            if data:
                conn.sendall(run(data.decode()).encode())
        except OSError as e:
            print("client error:", e, flush=True)
'''

PY_CLIENT = r"""
#!/bin/sh
# py CODE | py -f FILE  -- run code in the kernel on ./kernel.sock
if [ "$1" = -f ]; then code=$(cat "$2"); else code="$1"; fi
exec python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect("kernel.sock")
s.sendall(sys.argv[1].encode())
s.shutdown(socket.SHUT_WR)
out = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    out += b
sys.stdout.write(out.decode())
' "$code"
"""

PEOPLE = ["alice", "bob", "carol", "dave", "erin"]


@traj
def repl_kernel():
    t = Traj("repl-kernel", "Persistent Python kernel (in-memory namespace) used as a notebook for a ledger", "repl")
    t.r("ls -la && python3 --version")
    t.write("kernel.py", KERNEL)
    t.write("py", PY_CLIENT, mode="0755")
    t.sh("nohup python3 kernel.py </dev/null >kernel.log 2>&1 &\necho $! > kernel.pid\n" + wait_sock("kernel.sock"))
    t.r("./py '1 + 1'")
    t.r("./py 'import sys; sys.version_info[:2]'")
    t.sh("./py 'x = 41' && ./py 'x += 1; x'")
    t.r("./py 'undefined_name'")
    rng = random.Random(5)
    lines = ["date,src,dst,cents,memo"]
    memos = ["lunch", "taxi", "groceries", "tickets", "gift", "books", "coffee"]
    for i in range(36):
        a, b = rng.sample(PEOPLE, 2)
        lines.append("2025-01-%02d,%s,%s,%d,%s" % (1 + i * 28 // 36, a, b, rng.randint(3, 90) * 50, rng.choice(memos)))
    t.write("ledger.csv", "\n".join(lines) + "\n")
    t.r("head -n 4 ledger.csv && wc -l ledger.csv")
    t.sh("./py 'import csv; rows = list(csv.DictReader(open(\"ledger.csv\"))); len(rows)'")
    t.r("./py 'rows[0]'")
    t.r("./py 'sorted({r[\"src\"] for r in rows} | {r[\"dst\"] for r in rows})'")
    t.write("model.py", '''
        from dataclasses import dataclass, field


        @dataclass
        class Account:
            name: str
            opening: int = 10000
            history: list = field(default_factory=list)

            @property
            def balance(self):
                return self.opening + sum(self.history)


        accounts = {}
        journal = []


        def post(date, src, dst, cents, memo=""):
            if cents <= 0:
                raise ValueError("amount must be positive")
            for n in (src, dst):
                accounts.setdefault(n, Account(n))
            if accounts[src].balance < cents:
                raise ValueError("insufficient funds: %s has %d" % (src, accounts[src].balance))
            accounts[src].history.append(-cents)
            accounts[dst].history.append(cents)
            journal.append((date, src, dst, cents, memo))
            return len(journal)


        def balances():
            return {n: a.balance for n, a in sorted(accounts.items())}
        ''')
    t.sh("./py -f model.py && ./py 'balances()'")
    t.sh("./py 'for r in rows: post(r[\"date\"], r[\"src\"], r[\"dst\"], int(r[\"cents\"]), r[\"memo\"])'; ./py 'len(journal)'")
    t.r("./py 'rows[len(journal)]'")
    t.r("./py 'balances()'")
    t.r("./py 'sum(balances().values())'")
    t.sh("./py 'accounts.clear(); journal.clear(); skipped = []' && ./py 'for r in rows:\n    try:\n        post(r[\"date\"], r[\"src\"], r[\"dst\"], int(r[\"cents\"]), r[\"memo\"])\n    except ValueError as e:\n        skipped.append((r[\"date\"], r[\"src\"], int(r[\"cents\"]), str(e)))' && ./py 'len(journal), len(skipped)'")
    t.r("./py 'skipped'")
    t.r("./py 'balances()'")
    # February: the agent posts transactions one by one
    feb = []
    rng2 = random.Random(11)
    for d in range(1, 29, 1):
        if d % 3 == 0:
            continue
        a, b = rng2.sample(PEOPLE, 2)
        feb.append(("2025-02-%02d" % d, a, b, rng2.randint(2, 40) * 25, rng2.choice(memos)))
    for i, (date, a, b, c, m) in enumerate(feb):
        t.sh(f"./py 'post(\"{date}\", \"{a}\", \"{b}\", {c}, \"{m}\")'")
        if i % 5 == 4:
            t.r("./py 'balances()'")
    t.r("./py 'len(journal), sum(balances().values())'")
    t.sh("./py 'post(\"2025-02-28\", \"alice\", \"bob\", -5)'")
    # March: a standing order helper, then more postings
    t.sh("./py 'def standing(day, src, dst, cents, memo):\n    return post(\"2025-03-%02d\" % day, src, dst, cents, memo)'")
    rng3 = random.Random(3)
    for d in range(1, 31):
        if d % 4 == 0:
            continue
        a, b = rng3.sample(PEOPLE, 2)
        t.sh(f"./py 'standing({d}, \"{a}\", \"{b}\", {rng3.randint(1, 30) * 40}, \"{rng3.choice(memos)}\")'")
        if d % 7 == 6:
            t.r("./py 'balances()'")
    t.r("./py 'journal[-1], len(journal)'")
    # April: a few more, including a reversal of a wrong posting
    rng4 = random.Random(4)
    for d in range(1, 11):
        a, b = rng4.sample(PEOPLE, 2)
        t.sh(f"./py 'post(\"2025-04-{d:02d}\", \"{a}\", \"{b}\", {rng4.randint(1, 20) * 30}, \"{rng4.choice(memos)}\")'")
    t.r("./py 'journal[-2:]'")
    t.sh("./py 'date, src, dst, c, m = journal[-1]; post(\"2025-04-10\", dst, src, c, \"reversal: \" + m)'")
    t.r("./py 'balances(), len(journal)'")
    t.r("./py 'from collections import Counter; Counter(m for *_, m in journal).most_common(3)'")
    t.r("./py 'by_month = {}\nfor date, src, dst, c, m in journal:\n    by_month[date[:7]] = by_month.get(date[:7], 0) + c\nby_month'")
    t.sh("./py 'def fee(name, pct=1):\n    a = accounts[name]\n    f = a.balance * pct // 100\n    a.history.append(-f)\n    return f' && ./py 'fees = {n: fee(n) for n in sorted(accounts)}; fees'")
    t.r("./py 'balances()'")
    t.sh("./py 'def statement():\n    out = [\"%-6s %8s %8s\" % (\"name\", \"opening\", \"balance\")]\n    for n, a in sorted(accounts.items()):\n        out.append(\"%-6s %8.2f %8.2f\" % (n, a.opening / 100, a.balance / 100))\n    out.append(\"txns %d, skipped %d\" % (len(journal), len(skipped)))\n    return \"\\n\".join(out) + \"\\n\"' && ./py 'print(statement())'")
    t.sh("./py 'open(\"statement.txt\", \"w\").write(statement())' && cat statement.txt")
    t.r("./py '%vars' | head -n 30")
    t.r("./py 'richest = max(accounts.values(), key=lambda a: a.balance); richest.name, richest.balance'")
    t.r("tail -n 3 kernel.log; ls -la")
    t.verify = r"""
        set -e
        test "$(./py 'sum(balances().values()) + sum(fees.values())')" = 50000
        ./py 'journal[-1][4]' | grep -q reversal
        ./py 'print(statement(), end="")' | cmp - statement.txt
        test "$(./py 'len(journal) + len(skipped)')" = 89
        ./py 'isinstance(accounts["alice"].history, list)' | grep -qx True
        """
    t.probe = "./py '%vars'"
    t.volatile = REPL_VOLATILE
    return t


# ================================================================= read-heavy
@traj
def read_stdlib_survey():
    t = Traj("read-stdlib-survey", "Read-mostly survey of the Python stdlib (json, http.server, sqlite3) ending in notes", "read-heavy")
    L = "/usr/lib/python3.11"
    t.r("pwd; ls")
    t.r(f"ls {L} | head -n 40")
    t.r(f"ls {L} | wc -l")
    t.r(f"find {L} -maxdepth 1 -name '*.py' | wc -l")
    t.r(f"ls {L}/json")
    t.r(f"wc -l {L}/json/*.py")
    t.r(f"sed -n '1,40p' {L}/json/__init__.py")
    t.r(f"grep -n '^def ' {L}/json/__init__.py")
    t.r(f"sed -n '/^def dumps/,/^def /p' {L}/json/__init__.py | head -n 60")
    t.r(f"grep -n 'sort_keys' {L}/json/encoder.py | head -n 20")
    t.r(f"grep -n 'def floatstr' -A 25 {L}/json/encoder.py")
    t.r("python3 -c 'import json; print(json.dumps({\"b\": 1, \"a\": [1.0, float(\"inf\")]}, sort_keys=True))'")
    t.r("python3 -c 'import json; print(json.dumps(0.1 + 0.2), repr(0.1 + 0.2))'")
    t.r(f"grep -n 'c_make_encoder\\|c_encode_basestring' {L}/json/encoder.py | head")
    t.r("python3 -c 'import json.encoder as e; print(e.c_make_encoder is not None)'")
    t.r(f"grep -n 'class JSONDecodeError' -A 20 {L}/json/decoder.py")
    t.r("python3 -c 'import json\ntry:\n    json.loads(\"{\\\"a\\\": }\")\nexcept json.JSONDecodeError as e:\n    print(e.lineno, e.colno, e.msg)'")
    t.write("notes.md", """
        # stdlib survey notes

        ## json
        - `dumps(..., sort_keys=True)` sorts dict keys in the C encoder too (deterministic output).
        - floats go through `float.__repr__`; inf/nan are emitted as Infinity/NaN unless allow_nan=False.
        - JSONDecodeError carries lineno/colno.
        """)
    t.r(f"ls {L}/http && wc -l {L}/http/server.py")
    t.r(f"grep -n '^class ' {L}/http/server.py")
    t.r(f"grep -n 'allow_reuse_address\\|daemon_threads' {L}/http/server.py {L}/socketserver.py")
    t.r(f"sed -n '/^class HTTPServer/,/^class /p' {L}/http/server.py")
    t.r(f"grep -n 'def log_message' -A 20 {L}/http/server.py | head -n 25")
    t.r(f"grep -n 'def handle_one_request' -A 40 {L}/http/server.py | head -n 45")
    t.r(f"grep -n 'protocol_version' {L}/http/server.py")
    t.r(f"grep -n 'def send_response\\b' -A 12 {L}/http/server.py")
    t.r(f"grep -n 'def date_time_string' -A 8 {L}/http/server.py")
    t.r(f"grep -n 'server_version\\|sys_version' {L}/http/server.py | head")
    t.r("python3 -c 'import http.server as h; print(h.BaseHTTPRequestHandler.protocol_version, h.HTTPServer.allow_reuse_address)'")
    t.sh("""cat >> notes.md <<'EOF'

## http.server
- HTTPServer sets allow_reuse_address = 1; ThreadingHTTPServer adds daemon_threads = True.
- responses default to HTTP/1.0 (connection closes after each request) unless protocol_version is changed.
- every response carries a Date header (date_time_string) and log_message writes to stderr with a timestamp:
  override log_message when logs must be reproducible.
EOF
tail -n 6 notes.md""")
    t.r(f"ls {L}/sqlite3")
    t.r(f"grep -n 'isolation_level\\|def connect' {L}/sqlite3/*.py | head")
    t.r("python3 -c 'import sqlite3; print(sqlite3.sqlite_version, sqlite3.threadsafety, sqlite3.paramstyle)'")
    t.r("python3 -c 'import sqlite3; c = sqlite3.connect(\":memory:\"); print(c.isolation_level, c.in_transaction); c.execute(\"create table t(x)\"); c.execute(\"insert into t values (1)\"); print(c.in_transaction)'")
    t.r(f"grep -rn 'def __enter__\\|def __exit__' {L}/sqlite3/ | head; echo '(context manager is in C: _sqlite)'")
    t.r("python3 -c 'import sqlite3; help(sqlite3.Connection.__exit__)' | head -n 8")
    t.r(f"grep -n 'def iterdump' -A 30 {L}/sqlite3/dump.py | head -n 35")
    t.r("python3 -c 'import sqlite3; c = sqlite3.connect(\":memory:\"); c.execute(\"create table t(x)\"); c.executemany(\"insert into t values (?)\", [(3,), (1,)]); print(\"\\n\".join(c.iterdump()))'")
    t.sh("""cat >> notes.md <<'EOF'

## sqlite3
- default isolation_level '' = implicit BEGIN before DML; commit() or `with conn:` ends it.
- `with conn:` commits/rolls back but does not close the connection.
- Connection.iterdump() gives a deterministic SQL dump (good for comparing DB state).
EOF
wc -l notes.md""")
    t.r(f"grep -rln 'sort_keys' {L} --include='*.py' | head -n 10")
    t.r(f"grep -rc 'time.time()' {L}/http/server.py {L}/logging/__init__.py")
    t.r(f"find {L} -name 'random.py' -maxdepth 1 -exec grep -n 'def seed' -A 12 {{}} \\;")
    t.r("python3 -c 'import random; r = random.Random(42); print([r.randint(1, 6) for _ in range(5)])'")
    t.r("PYTHONHASHSEED=0 python3 -c 'print(list({\"b\", \"a\", \"c\"}))'; PYTHONHASHSEED=1 python3 -c 'print(list({\"b\", \"a\", \"c\"}))'")
    t.r("cat notes.md")
    t.write("notes.md", """
        # stdlib survey notes

        ## json
        - `dumps(..., sort_keys=True)` sorts dict keys in the C encoder too (deterministic output).
        - floats go through `float.__repr__`; inf/nan are emitted as Infinity/NaN unless allow_nan=False.
        - JSONDecodeError carries lineno/colno.

        ## http.server
        - HTTPServer sets allow_reuse_address = 1; ThreadingHTTPServer adds daemon_threads = True.
        - responses default to HTTP/1.0 (connection closes after each request) unless protocol_version is changed.
        - every response carries a Date header (date_time_string) and log_message writes to stderr with a timestamp:
          override log_message when logs must be reproducible.

        ## sqlite3
        - default isolation_level '' = implicit BEGIN before DML; commit() or `with conn:` ends it.
        - `with conn:` commits/rolls back but does not close the connection.
        - Connection.iterdump() gives a deterministic SQL dump (good for comparing DB state).

        ## determinism checklist
        - random.Random(seed) is reproducible; set orders depend on PYTHONHASHSEED for str.
        - avoid time.time()/Date headers in anything that is compared between runs.
        """)
    t.r("grep -c '^- ' notes.md && grep '^## ' notes.md")
    t.verify = r"""
        set -e
        test "$(grep -c '^## ' notes.md)" = 4
        grep -q 'allow_reuse_address' notes.md
        grep -q 'iterdump' notes.md
        grep -q 'PYTHONHASHSEED' notes.md
        """
    return t


SETUP_TALLY = r'''
"""Creates the `tally` repository (a small invoicing library) with its git history."""
import os
import subprocess
import textwrap


def w(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text).lstrip("\n"))


def commit(msg):
    subprocess.run(["git", "add", "-A"], check=True)
    subprocess.run(["git", "commit", "-q", "-m", msg], check=True)


os.makedirs("tally", exist_ok=True)
os.chdir("tally")
subprocess.run(["git", "init", "-q", "-b", "main"], check=True)
w("README.md", """
    # tally
    Tiny invoicing library: money parsing, invoices with tax and discounts, reports.
    Run the tests with `python3 -m unittest discover -s tests -t .`
    """)
w("tally/__init__.py", '__version__ = "0.3.0"\n')
w("tally/money.py", """
    def parse_amount(text):
        \"\"\"'12.3' -> 1230 cents; accepts a leading minus and thousands separators.\"\"\"
        text = text.strip().replace(",", "")
        neg = text.startswith("-")
        if neg:
            text = text[1:]
        units, _, frac = text.partition(".")
        cents = int(units or "0") * 100 + int((frac + "00")[:2])
        return -cents if neg else cents


    def format_cents(cents):
        sign = "-" if cents < 0 else ""
        cents = abs(cents)
        return "%s%d.%02d" % (sign, cents // 100, cents % 100)
    """)
w("tests/__init__.py", "")
w("tests/test_money.py", """
    import unittest

    from tally.money import format_cents, parse_amount


    class MoneyTest(unittest.TestCase):
        def test_parse(self):
            self.assertEqual(parse_amount("12.3"), 1230)
            self.assertEqual(parse_amount("1,234.56"), 123456)
            self.assertEqual(parse_amount("-0.05"), -5)

        def test_format(self):
            self.assertEqual(format_cents(-5), "-0.05")
            self.assertEqual(format_cents(123456), "1234.56")
    """)
commit("money: parse and format amounts")
w("tally/invoice.py", """
    from .money import format_cents

    TAX_RATES = {"std": 19, "reduced": 7, "zero": 0}


    class Invoice:
        def __init__(self, customer, discount_pct=0):
            self.customer = customer
            self.discount_pct = discount_pct
            self.lines = []

        def add(self, desc, qty, unit_cents, rate="std"):
            self.lines.append((desc, qty, unit_cents, rate))

        def subtotal(self):
            return sum(q * u for _, q, u, _ in self.lines)

        def discount(self):
            return self.subtotal() * self.discount_pct // 100

        def tax(self):
            total = 0
            for _, q, u, rate in self.lines:
                net = q * u * (100 - self.discount_pct) / 100
                total += round(net * TAX_RATES[rate] / 100)
            return total

        def total(self):
            return self.subtotal() - self.discount() + self.tax()

        def render(self):
            out = ["Invoice for %s" % self.customer]
            for d, q, u, r in self.lines:
                out.append("  %-20s %3d x %8s" % (d, q, format_cents(u)))
            out.append("  total %s" % format_cents(self.total()))
            return "\\n".join(out)
    """)
w("tests/test_invoice.py", """
    import unittest

    from tally.invoice import Invoice


    class InvoiceTest(unittest.TestCase):
        def test_simple(self):
            inv = Invoice("acme")
            inv.add("widget", 2, 1000)
            self.assertEqual(inv.subtotal(), 2000)
            self.assertEqual(inv.tax(), 380)
            self.assertEqual(inv.total(), 2380)

        def test_reduced_rate(self):
            inv = Invoice("acme")
            inv.add("book", 1, 1999, "reduced")
            self.assertEqual(inv.tax(), 140)

        def test_rounding_half_up(self):
            inv = Invoice("acme")
            inv.add("part", 1, 1999)
            self.assertEqual(inv.tax(), 380)

        def test_discount(self):
            inv = Invoice("acme", discount_pct=10)
            inv.add("widget", 10, 1000)
            self.assertEqual(inv.discount(), 1000)
            self.assertEqual(inv.tax(), 1710)
    """)
commit("invoice: lines, tax rates, discounts")
w("tally/report.py", """
    from collections import defaultdict

    from .money import format_cents


    def by_customer(invoices):
        totals = defaultdict(int)
        for inv in invoices:
            totals[inv.customer] += inv.total()
        return dict(sorted(totals.items()))


    def render(invoices):
        return "\\n".join("%-10s %10s" % (c, format_cents(t)) for c, t in by_customer(invoices).items())
    """)
w("tests/test_report.py", """
    import unittest

    from tally.invoice import Invoice
    from tally.report import by_customer


    class ReportTest(unittest.TestCase):
        def test_by_customer(self):
            a, b, c = Invoice("zeta"), Invoice("acme"), Invoice("acme")
            a.add("x", 1, 100, "zero")
            b.add("y", 1, 200, "zero")
            c.add("z", 1, 300, "zero")
            self.assertEqual(list(by_customer([a, b, c]).items()), [("acme", 500), ("zeta", 100)])
    """)
commit("report: totals by customer")
# the regression: "avoid floats" refactor truncates instead of rounding
src = open("tally/invoice.py").read()
src = src.replace("            net = q * u * (100 - self.discount_pct) / 100\n            total += round(net * TAX_RATES[rate] / 100)",
                  "            net = q * u * (100 - self.discount_pct)\n            total += net * TAX_RATES[rate] // 10000")
assert "// 10000" in src
open("tally/invoice.py", "w").write(src)
commit("invoice: integer-only tax computation (no floats)")
w("tally/cli.py", """
    import sys

    from .invoice import Invoice
    from .money import parse_amount


    def main(argv):
        inv = Invoice(argv[0])
        for spec in argv[1:]:
            desc, qty, price = spec.split(":")
            inv.add(desc, int(qty), parse_amount(price))
        print(inv.render())


    if __name__ == "__main__":
        main(sys.argv[1:])
    """)
commit("cli: render an invoice from the command line")
w("CHANGELOG.md", """
    # Changelog
    ## 0.3.0
    - cli
    - integer-only tax computation
    ## 0.2.0
    - reports
    ## 0.1.0
    - money, invoices
    """)
commit("docs: changelog for 0.3.0")
subprocess.run(["git", "tag", "v0.3.0"], check=True)
print("created", os.getcwd())
'''


@traj
def read_bugfix():
    t = Traj("read-bugfix", "Read-heavy investigation of a failing test in a small repo, ending in a one-line fix", "read-heavy")
    t.r("ls -la")
    t.write("setup_repo.py", SETUP_TALLY)
    t.sh("python3 setup_repo.py && rm setup_repo.py")
    T = "cd tally && "
    for c in ["ls -la", "cat README.md", "git log --oneline --decorate", "git status",
              "find . -path ./.git -prune -o -type f -print | sort", "wc -l tally/*.py tests/*.py",
              "python3 -m unittest discover -s tests -t . 2>&1 | tail -n 25",
              "python3 -m unittest discover -s tests -t . -v 2>&1 | grep -E 'ok$|FAIL|ERROR'",
              "cat tests/test_invoice.py", "cat tally/invoice.py",
              "grep -n 'def tax' -A 7 tally/invoice.py",
              "python3 -c 'from tally.invoice import Invoice; i = Invoice(\"a\"); i.add(\"p\", 1, 1999); print(i.tax())'",
              "python3 -c 'print(1999 * 19 / 100, round(1999 * 19 / 100), 1999 * 19 // 100)'",
              "python3 -c 'from tally.invoice import Invoice; i = Invoice(\"a\"); i.add(\"b\", 1, 1999, \"reduced\"); print(i.tax(), 1999 * 7 / 100)'",
              "git log --oneline -- tally/invoice.py", "git log -p --follow -- tally/invoice.py | head -n 80",
              "git show --stat HEAD~2", "git show HEAD~2 -- tally/invoice.py",
              "git log --format='%h %an %ad %s' --date=short", "git blame -L '/def tax/,+6' tally/invoice.py",
              "git grep -n 'round' ", "git grep -n '//' -- 'tally/*.py'",
              "git diff v0.3.0~4 v0.3.0 --stat", "cat tally/money.py",
              "python3 -c 'from tally.money import parse_amount as p; print(p(\"19.99\"), p(\"-0.5\"), p(\"1,000\"))'",
              "cat tests/test_money.py", "cat tally/report.py tests/test_report.py",
              "cat tally/cli.py", "python3 -m tally.cli acme part:1:19.99",
              "python3 -m tally.cli acme widget:2:10.00 part:1:19.99",
              "python3 -c 'print(2000 * 19 / 100 + 1999 * 19 / 100)'",
              "git show HEAD~3:tally/invoice.py | grep -n 'round' ",
              "git stash list; git branch -a; git tag",
              "grep -rn 'discount_pct' tally/",
              "python3 -c 'from tally.invoice import Invoice; i = Invoice(\"a\", 10); i.add(\"w\", 10, 1000); print(i.discount(), i.tax(), i.total())'",
              "python3 -c 'print(10 * 1000 * 90 * 19 / 1000000)'",
              "python3 -c 'for u in (1, 5, 26, 50, 1999, 2631): print(u, u * 19 / 100, round(u * 19 / 100), u * 19 // 100, (u * 19 + 50) // 100)'",
              "python3 -c 'print(round(0.5), round(1.5), round(2.5))'",
              "python3 -c 'print((2 * 19 + 50) // 100 if False else [(n, (n * 19 * 100 + 5000) // 10000) for n in (50, 150, 250)])'",
              "cat CHANGELOG.md", "git show v0.3.0 --stat | head -n 8",
              "git log --all --oneline | wc -l", "git rev-parse HEAD~2"]:
        t.r(T + c)
    for i in range(6, 0, -1):
        t.r(T + f"git show --stat --format='%h %s' HEAD~{i - 1} | head -n 6")
    for c in ["git log --format=%s | grep -c invoice", "git show HEAD~2 --format=%B --no-patch",
              "git diff HEAD~3 HEAD~2 -- tally/invoice.py | grep '^[-+]' ",
              "git log -S'// 10000' --oneline", "git log -G'round\\(' --oneline",
              "python3 --version", "python3 -c 'import tally; print(tally.__version__, tally.__file__)'",
              "python3 -m unittest tests.test_invoice.InvoiceTest.test_rounding_half_up 2>&1 | tail -n 4",
              "python3 -m unittest tests.test_invoice.InvoiceTest.test_reduced_rate 2>&1 | tail -n 4",
              "python3 -m unittest tests.test_money tests.test_report -v 2>&1 | tail -n 5",
              "python3 -c 'from tally.invoice import TAX_RATES; print(TAX_RATES)'",
              "python3 -c 'from tally.invoice import Invoice; i = Invoice(\"a\"); i.add(\"z\", 3, 333, \"zero\"); print(i.tax(), i.total())'",
              "python3 -c 'from tally.report import render; from tally.invoice import Invoice; a = Invoice(\"x\"); a.add(\"p\", 1, 1999); print(render([a]))'",
              "python3 -c 'print([(n, n * 7 / 100) for n in (1999, 2001, 50)])'",
              "grep -n 'TAX_RATES\\|discount' tests/test_invoice.py",
              "sed -n '/def tax/,/return total/p' tally/invoice.py",
              "git show HEAD~3:tally/invoice.py | sed -n '/def tax/,/return total/p'",
              "git log --format='%h %s' --reverse | head -n 3",
              "ls tests && grep -c 'def test_' tests/*.py", "git config --list --show-origin | grep -v '^file:/etc' | head"]:
        t.r(T + c)
    t.r("cd tally && python3 -c 'import ast, sys; print([n.name for n in ast.walk(ast.parse(open(\"tally/invoice.py\").read())) if isinstance(n, ast.FunctionDef)])'")
    t.r("cd tally && grep -n 'total += ' tally/invoice.py")
    t.write("NOTES.md", """
        # failing tests: test_invoice.InvoiceTest.test_rounding_half_up and .test_reduced_rate

        - tax of 19.99 at 19% is 3.7981 -> expected 3.80, got 3.79; at 7% 1.3993 -> expected 1.40, got 1.39.
        - introduced by "invoice: integer-only tax computation (no floats)" (HEAD~2):
          `net * rate // 10000` truncates; before it used round() on floats.
        - fix: round half up with integers: `(net * rate + 5000) // 10000`
          (amounts are non-negative here; the old float round() was banker's rounding at exact .5).
        """)
    t.sh("cd tally && sed -i 's|total += net \\* TAX_RATES\\[rate\\] // 10000|total += (net * TAX_RATES[rate] + 5000) // 10000|' tally/invoice.py && git diff")
    for c in ["python3 -m unittest discover -s tests -t . 2>&1 | tail -n 3",
              "python3 -m unittest discover -s tests -t . -v 2>&1 | grep -c 'ok$'",
              "python3 -m tally.cli acme widget:2:10.00 part:1:19.99",
              "python3 -c 'from tally.invoice import Invoice; i = Invoice(\"a\", 10); i.add(\"w\", 10, 1000); print(i.tax())'",
              "git diff --stat"]:
        t.r(T + c)
    t.sh("cd tally && git commit -q -am 'invoice: round tax half up (fixes 1-cent truncation from integer refactor)' && git log --oneline -3")
    for c in ["git show --stat HEAD", "git status --short | wc -l", "git log --oneline v0.3.0..HEAD"]:
        t.r(T + c)
    t.r("cat NOTES.md")
    t.verify = r"""
        set -e
        cd tally
        python3 -m unittest discover -s tests -t . 2>&1 | tail -n 1 | grep -qx OK
        test "$(git rev-list --count HEAD)" = 7
        test -z "$(git status --porcelain)"
        git log -1 --format=%s | grep -q 'round tax half up'
        python3 -m tally.cli acme part:1:19.99 | grep -q 'total 23.79'
        grep -q HEAD~2 ../NOTES.md
        """
    t.volatile = ["tally/.git/index", "tally/.git/logs/**"]
    return t


MKVARLOG = r'''
"""Creates incident/ : a snapshot of service logs and configs to triage (deterministic)."""
import json
import os
import random

rng = random.Random(404)
os.makedirs("incident/logs", exist_ok=True)
os.makedirs("incident/etc", exist_ok=True)
services = ["gateway", "auth", "orders", "billing"]
t = 0
for svc in services:
    with open("incident/logs/%s.log" % svc, "w") as f:
        t = 0
        for i in range(400):
            t += rng.randint(1, 20)
            hh, mm, ss = 9 + t // 3600, t // 60 % 60, t % 60
            level = rng.choices(["INFO", "WARN", "ERROR"], [90, 7, 3])[0]
            msg = rng.choice(["request ok", "cache miss", "retrying upstream", "slow query", "connection reset"])
            if svc == "billing" and 200 <= i < 260:
                level, msg = "ERROR", "db pool exhausted (size=5, waiting=%d)" % (i - 195)
            if svc == "orders" and 205 <= i < 262 and i % 2:
                level, msg = "ERROR", "upstream billing timeout after 3000ms"
            f.write("2025-05-14T%02d:%02d:%02dZ %-5s %s req=%s-%04d\n" % (hh, mm, ss, level, msg, svc[:2], i))
json.dump({"gateway": {"timeout_ms": 5000}, "auth": {"pool": 20}, "orders": {"timeout_ms": 3000, "retries": 2},
           "billing": {"pool": 5, "timeout_ms": 10000}}, open("incident/etc/services.json", "w"), indent=1, sort_keys=True)
with open("incident/etc/deploys.txt", "w") as f:
    f.write("2025-05-14T09:33:00Z billing v2.7.0 -> v2.8.0 (pool size config moved to env)\n")
    f.write("2025-05-13T16:00:00Z auth v1.12.1 -> v1.12.2\n")
print("ok")
'''


@traj
def read_logs_triage():
    t = Traj("read-logs-triage", "Read-mostly incident triage over service logs and configs, ending in a short write-up", "read-heavy")
    t.write("mkincident.py", MKVARLOG)
    t.sh("python3 mkincident.py && rm mkincident.py && find incident -type f | sort")
    for c in ["wc -l incident/logs/*.log",
              "head -n 3 incident/logs/gateway.log",
              "grep -c ERROR incident/logs/*.log",
              "grep ERROR incident/logs/billing.log | head -n 5",
              "grep ERROR incident/logs/billing.log | awk '{$1 = \"\"; $3 = \"\"; print}' | sed 's/waiting=[0-9]*/waiting=N/; s/req=.*//' | sort | uniq -c | sort -rn",
              "grep -m1 'pool exhausted' incident/logs/billing.log; grep 'pool exhausted' incident/logs/billing.log | tail -n 1",
              "grep ERROR incident/logs/orders.log | awk '{print $3, $4, $5}' | sort | uniq -c | sort -rn | head",
              "grep -m1 'billing timeout' incident/logs/orders.log && grep 'billing timeout' incident/logs/orders.log | tail -n 1",
              "cat incident/etc/deploys.txt",
              "cat incident/etc/services.json",
              "python3 -c \"import json; print(json.load(open('incident/etc/services.json'))['billing'])\"",
              "awk '$2 == \"ERROR\" {print substr($1, 12, 5)}' incident/logs/*.log | sort | uniq -c | sort -k2",
              "awk '$2 == \"ERROR\" {split(FILENAME, p, \"/\"); c[p[3]]++} END {for (k in c) print c[k], k}' incident/logs/*.log | sort -rn",
              "grep -h 'connection reset' incident/logs/*.log | wc -l",
              "grep -c WARN incident/logs/*.log",
              "sed -n '195,205p' incident/logs/billing.log",
              "tail -n 3 incident/logs/billing.log",
              "grep -n 'billing' incident/logs/gateway.log | head -n 3; echo '(gateway does not name upstreams)'",
              "awk '{print $1}' incident/logs/billing.log | sed -n '1p;$p'",
              "awk '{print $1}' incident/logs/orders.log | sed -n '1p;$p'",
              "grep 'pool exhausted' incident/logs/billing.log | awk '{print $1}' | sed -n '1p;$p'",
              "grep -c 'db pool exhausted' incident/logs/billing.log",
              "ls -la incident incident/logs incident/etc",
              "du -a incident | sort -n | tail -n 4"]:
        t.r(c)
    t.write("TRIAGE.md", """
        # Incident 2025-05-14: orders failing with billing timeouts

        - billing: 60 consecutive ERROR "db pool exhausted (size=5 ...)" from 09:33:50, right after the 09:33 deploy of v2.8.0,
          which moved the pool size to an env var; the service fell back to pool=5.
        - orders: ERROR "upstream billing timeout after 3000ms" during the same window (orders timeout 3000 ms < billing's 10 s).
        - gateway/auth: background noise only (a few ERRORs, none correlated).

        Action: set BILLING_DB_POOL=20 (as before v2.8.0), then consider orders.timeout_ms >= billing p99.
        """)
    t.r("grep -c '^- ' TRIAGE.md && head -n 1 TRIAGE.md")
    t.verify = r"""
        set -e
        test "$(grep -c 'db pool exhausted' incident/logs/billing.log)" = 60
        grep -q 'v2.8.0' TRIAGE.md
        grep -q 'BILLING_DB_POOL' TRIAGE.md
        test "$(ls incident/logs | wc -l)" = 4
        """
    return t


# ====================================================================== mixed
INGEST = r'''
"""ingest: HTTP log-ingest service on 127.0.0.1:9031.

POST /ingest   body = log lines "<service> <LEVEL> <request-id> <message>"
               appends new lines to data/ingested.log; duplicates (same request id) are dropped
GET  /stats    counters kept in memory only (per level, per service, dropped duplicates)
"""
import json
import os
from collections import Counter
from http.server import BaseHTTPRequestHandler, HTTPServer

os.makedirs("data", exist_ok=True)
seen = set()
by_level = Counter()
by_service = Counter()
dropped = 0


class H(BaseHTTPRequestHandler):
    def reply(self, obj):
        data = (json.dumps(obj, sort_keys=True) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        global dropped
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        accepted = 0
        with open("data/ingested.log", "a") as out:
            for line in body.splitlines():
                parts = line.split(" ", 3)
                if len(parts) < 4:
                    continue
                svc, level, rid, msg = parts
                if rid in seen:
                    dropped += 1
                    continue
                seen.add(rid)
                by_level[level] += 1
                by_service[svc] += 1
                out.write(line + "\n")
                accepted += 1
        self.reply({"accepted": accepted})

    def do_GET(self):
        if self.path == "/stats":
            return self.reply({"by_level": dict(sorted(by_level.items())), "by_service": dict(sorted(by_service.items())),
                               "dropped": dropped, "unique": len(seen)})
        self.reply({"ok": True})

    def log_message(self, *a):
        pass


HTTPServer(("127.0.0.1", 9031), H).serve_forever()
'''


@traj
def mixed_log_service():
    t = Traj("mixed-log-service", "Log-ingest service (in-memory counters + on-disk log) fed in batches, make-driven report", "mixed")
    t.r("ls -la && make --version | head -n 1")
    t.write("ingest.py", INGEST)
    t.write("send.py", '''
        """usage: python3 send.py FILE [FROM TO]  -- POST lines FROM..TO (1-based, inclusive) to the ingest service"""
        import sys
        import urllib.request

        lines = open(sys.argv[1]).read().splitlines()
        lo, hi = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (1, len(lines))
        body = "\\n".join(lines[lo - 1:hi]).encode()
        req = urllib.request.Request("http://127.0.0.1:9031/ingest", data=body, method="POST")
        print(urllib.request.urlopen(req, timeout=5).read().decode(), end="")
        ''')
    t.write("stats.py", '''
        import json
        import urllib.request

        print(json.dumps(json.load(urllib.request.urlopen("http://127.0.0.1:9031/stats", timeout=5)), indent=1, sort_keys=True))
        ''')
    t.sh("nohup python3 ingest.py </dev/null >ingest.log 2>&1 &\necho $! > ingest.pid\n" + wait_port(9031))
    t.r("python3 stats.py")
    t.write("mkbatches.py", '''
        """Writes batches/batch-NN.log: simulated log lines with some re-sent (duplicate) request ids."""
        import os
        import random

        rng = random.Random(31)
        os.makedirs("batches", exist_ok=True)
        rid = 0
        recent = []
        for b in range(1, 9):
            with open("batches/batch-%02d.log" % b, "w") as f:
                for _ in range(60):
                    if recent and rng.random() < 0.1:
                        line = rng.choice(recent)  # client retry: same request id again
                    else:
                        rid += 1
                        svc = rng.choice(["api", "web", "worker"])
                        level = rng.choices(["INFO", "WARN", "ERROR"], [80, 15, 5])[0]
                        line = "%s %s r%05d %s" % (svc, level, rid, rng.choice(["ok", "slow", "retry", "fail"]))
                        recent = (recent + [line])[-20:]
                    f.write(line + "\\n")
        print(rid, "unique requests")
        ''')
    t.sh("python3 mkbatches.py && ls batches && head -n 3 batches/batch-01.log")
    t.r("cat batches/*.log | awk '{print $3}' | sort | uniq -d | wc -l")
    for b in range(1, 9):
        if b == 4:
            t.sh("python3 send.py batches/batch-04.log 1 30")
            t.r("python3 stats.py | grep -A3 by_level")
            t.sh("python3 send.py batches/batch-04.log 31 60")
            continue
        t.sh(f"python3 send.py batches/batch-{b:02d}.log")
        if b % 3 == 0:
            t.r("python3 stats.py")
    t.sh("python3 send.py batches/batch-02.log 10 20")
    t.r("python3 stats.py")
    t.r("wc -l data/ingested.log && awk '{print $3}' data/ingested.log | sort | uniq -d | wc -l")
    t.write("Makefile", """
        PY = python3

        all: report/summary.txt

        report/stats.json: data/ingested.log
        \t@mkdir -p report
        \t$(PY) stats.py > $@

        report/errors.txt: data/ingested.log
        \t@mkdir -p report
        \tawk '$$2 == "ERROR"' data/ingested.log | sort -k3,3 > $@

        report/summary.txt: report/stats.json report/errors.txt
        \t$(PY) summarize.py > $@
        \tcat $@

        clean:
        \trm -rf report

        .PHONY: all clean
        """)
    t.write("summarize.py", '''
        import json

        s = json.load(open("report/stats.json"))
        errors = open("report/errors.txt").read().splitlines()
        disk = sum(1 for _ in open("data/ingested.log"))
        print("unique requests: %d (dropped duplicates: %d)" % (s["unique"], s["dropped"]))
        print("on disk: %d lines (%s)" % (disk, "consistent" if disk == s["unique"] else "MISMATCH"))
        for level, n in s["by_level"].items():
            print("%-6s %4d" % (level, n))
        for svc, n in s["by_service"].items():
            print("service %-7s %4d" % (svc, n))
        print("errors: %d, first %s" % (len(errors), errors[0].split()[2] if errors else "-"))
        ''')
    t.sh("make")
    t.r("cat report/errors.txt | head -n 5")
    t.sh("make; echo \"exit=$?\"")
    t.r("make -n")
    t.sh("printf 'api ERROR r99999 manual test\\n' > extra.log && python3 send.py extra.log && rm extra.log && make")
    t.r("tail -n 2 data/ingested.log && grep -c . report/errors.txt")
    t.r("python3 stats.py | grep -E 'dropped|unique'")
    t.verify = r"""
        set -e
        python3 stats.py > /tmp/stats.json
        cmp /tmp/stats.json report/stats.json
        test "$(wc -l < data/ingested.log)" = "$(python3 -c 'import json; print(json.load(open("/tmp/stats.json"))["unique"])')"
        grep -q 'consistent' report/summary.txt
        test "$(awk '{print $3}' data/ingested.log | sort | uniq -d | wc -l)" = 0
        grep -q r99999 report/errors.txt
        """
    t.probe = "python3 stats.py"
    t.volatile = ["ingest.log", "ingest.pid"]
    return t


@traj
def mixed_make_python():
    t = Traj("mixed-make-python", "Make-driven Python project: venv, hand-built wheel, tests, docs, reproducible dist", "mixed")
    t.r("ls -la && make -v | head -n 1 && python3 --version")
    t.write("src/csvq/__init__.py", '''
        """csvq: tiny query tool for CSV files."""

        __version__ = "0.1.0"
        ''')
    t.write("src/csvq/query.py", '''
        """Filtering, projection and aggregation over CSV rows (lists of dicts)."""
        import csv
        import operator

        OPS = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}


        def load(path):
            """Read a CSV file into a list of dicts."""
            with open(path, newline="") as f:
                return list(csv.DictReader(f))


        def _num(v):
            try:
                return float(v)
            except ValueError:
                return v


        def where(rows, expr):
            """Keep rows matching 'col OP value' with OP one of = != < >."""
            for op in ("=", "!=", "<", ">"):
                if op in expr:
                    col, val = (s.strip() for s in expr.split(op, 1))
                    return [r for r in rows if OPS[op](_num(r[col]), _num(val))]
            raise ValueError("bad expression: " + expr)


        def select(rows, cols):
            """Project rows onto the given columns."""
            return [{c: r[c] for c in cols} for r in rows]


        def group_sum(rows, key, col):
            """Sum col per distinct key, sorted by key."""
            out = {}
            for r in rows:
                out[r[key]] = out.get(r[key], 0) + float(r[col])
            return dict(sorted(out.items()))
        ''')
    t.write("src/csvq/__main__.py", '''
        import sys

        from .query import group_sum, load, select, where


        def main(argv):
            rows = load(argv[0])
            args = argv[1:]
            while args:
                op = args.pop(0)
                if op == "where":
                    rows = where(rows, args.pop(0))
                elif op == "select":
                    rows = select(rows, args.pop(0).split(","))
                elif op == "sum":
                    key, col = args.pop(0).split(":")
                    for k, v in group_sum(rows, key, col).items():
                        print("%s\\t%g" % (k, v))
                    return 0
            for r in rows:
                print("\\t".join(r.values()))
            return 0


        sys.exit(main(sys.argv[1:]))
        ''')
    t.write("tests/test_query.py", '''
        import unittest

        from csvq.query import group_sum, select, where

        ROWS = [{"city": "Oslo", "temp": "4", "rain": "12"}, {"city": "Rome", "temp": "18", "rain": "3"},
                {"city": "Oslo", "temp": "9", "rain": "7"}, {"city": "Lima", "temp": "19", "rain": "0"}]


        class QueryTest(unittest.TestCase):
            def test_where_num(self):
                self.assertEqual([r["city"] for r in where(ROWS, "temp > 10")], ["Rome", "Lima"])

            def test_where_ne(self):
                self.assertEqual(len(where(ROWS, "city != Oslo")), 2)

            def test_where_eq_number(self):
                self.assertEqual(where(ROWS, "rain = 0")[0]["city"], "Lima")

            def test_select(self):
                self.assertEqual(select(ROWS[:1], ["city"]), [{"city": "Oslo"}])

            def test_group_sum(self):
                self.assertEqual(group_sum(ROWS, "city", "rain"), {"Lima": 0, "Oslo": 19, "Rome": 3})
        ''')
    t.write("tools/mkwheel.py", MKWHEEL)
    t.write("tools/mkdoc.py", '''
        """Writes docs/API.md from the docstrings of csvq.query."""
        import inspect
        import sys

        sys.path.insert(0, "src")
        import csvq.query as q  # noqa: E402

        out = ["# csvq.query", "", inspect.getdoc(q), ""]
        for name, fn in sorted(inspect.getmembers(q, inspect.isfunction)):
            if name.startswith("_") or fn.__module__ != q.__name__:
                continue
            out += ["## %s%s" % (name, inspect.signature(fn)), "", inspect.getdoc(fn) or "(undocumented)", ""]
        open("docs/API.md", "w").write("\\n".join(out))
        print("\\n".join(out))
        ''')
    t.write("Makefile", """
        VERSION := $(shell sed -n 's/^__version__ = "\\(.*\\)"/\\1/p' src/csvq/__init__.py)
        WHEEL := dist/csvq-$(VERSION)-py3-none-any.whl
        PY := .venv/bin/python

        all: test docs dist

        .venv/bin/python:
        \tpython3 -m venv .venv

        $(WHEEL): $(wildcard src/csvq/*.py)
        \tpython3 tools/mkwheel.py src csvq $(VERSION) dist

        install: .venv/bin/python $(WHEEL)
        \t$(PY) -m pip install -q --no-index --disable-pip-version-check --force-reinstall $(WHEEL)

        test: install
        \tcd tests && ../$(PY) -m unittest -v 2>&1 | tail -n 4

        docs: docs/API.md
        docs/API.md: src/csvq/query.py tools/mkdoc.py
        \t@mkdir -p docs
        \tpython3 tools/mkdoc.py > /dev/null

        dist: $(WHEEL) docs/API.md
        \ttar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - src docs Makefile | gzip -n > dist/csvq-$(VERSION)-src.tar.gz
        \tls dist

        clean:
        \trm -rf dist docs .venv

        .PHONY: all install test docs dist clean
        """)
    t.r("make -n all | head -n 20")
    t.sh("make test; echo \"exit=$?\"")
    t.r("cd tests && ../.venv/bin/python -m unittest test_query.QueryTest.test_where_ne 2>&1 | tail -n 8")
    t.r("grep -n 'split(op, 1)' -B2 -A2 src/csvq/query.py")
    t.r("python3 -c 'print(\"=\" in \"city != Oslo\", \"city != Oslo\".split(\"=\", 1))'")
    t.r("python3 -c 'import sys; sys.path.insert(0, \"src\"); from csvq.query import _num; print(repr(_num(\"0\")), repr(_num(\" 0\")))'")
    t.sh("""sed -i 's/    for op in ("=", "!=", "<", ">"):/    for op in ("!=", "=", "<", ">"):  # two-char operators first/' src/csvq/query.py && grep -n "for op in" src/csvq/query.py""")
    t.sh("make test 2>&1 | tail -n 3")
    t.write("data/weather.csv", """
        city,month,temp,rain
        Oslo,1,-4,49
        Oslo,7,17,81
        Rome,1,8,67
        Rome,7,25,19
        Lima,1,23,1
        Lima,7,16,4
        Nairobi,1,19,64
        Nairobi,7,16,15
        """)
    t.r(".venv/bin/python -m csvq data/weather.csv where 'month = 7' select city,temp")
    t.r(".venv/bin/python -m csvq data/weather.csv sum city:rain")
    t.r(".venv/bin/python -m csvq data/weather.csv where 'temp < 0'")
    t.r(".venv/bin/python -m csvq data/weather.csv where 'city != Oslo' where 'month = 1' sum city:temp")
    t.sh("make docs && cat docs/API.md")
    t.r("grep -c '^## ' docs/API.md")
    # add a feature: order by
    t.sh(r'''cat >> src/csvq/query.py <<'EOF'


def order_by(rows, col, reverse=False):
    """Sort rows by a column (numeric when possible)."""
    return sorted(rows, key=lambda r: (_num(r[col]) if isinstance(_num(r[col]), float) else float("inf"), r[col]), reverse=reverse)
EOF
tail -n 5 src/csvq/query.py''')
    t.sh(r"""sed -i 's/^from .query import group_sum, load, select, where$/from .query import group_sum, load, order_by, select, where/; s/^        elif op == "select":$/        elif op == "order":\n            rows = order_by(rows, args.pop(0))\n        elif op == "select":/' src/csvq/__main__.py && grep -n 'order' src/csvq/__main__.py""")
    t.sh(r"""sed -i 's/^__version__ = "0.1.0"$/__version__ = "0.2.0"/' src/csvq/__init__.py && make -s install && .venv/bin/python -m csvq data/weather.csv where 'month = 7' order temp select city,temp""")
    t.sh(r"""cat >> tests/test_query.py <<'EOF'


class OrderTest(unittest.TestCase):
    def test_order_numeric(self):
        from csvq.query import order_by
        self.assertEqual([r["temp"] for r in order_by(ROWS, "temp")], ["4", "9", "18", "19"])
EOF
make test""")
    t.sh("make all")
    t.r("ls -la dist && tar -tzf dist/csvq-0.2.0-src.tar.gz")
    t.r(".venv/bin/pip list --disable-pip-version-check | grep csvq")
    t.r("sha256sum dist/*")
    t.verify = r"""
        set -e
        test "$(.venv/bin/pip show --disable-pip-version-check csvq | sed -n 's/^Version: //p')" = 0.2.0
        cd tests && ../.venv/bin/python -m unittest -q 2>&1 | tail -n 1 | grep -qx OK && cd ..
        test "$(.venv/bin/python -m csvq data/weather.csv where 'month = 7' order temp select city,temp | head -n 1)" = "$(printf 'Lima\t16')"
        grep -q '^## order_by' docs/API.md
        tar -tzf dist/csvq-0.2.0-src.tar.gz | grep -qx src/csvq/query.py
        """
    t.volatile = VENV_VOLATILE
    return t


SETUP_INIQ = r'''
"""Creates the `iniq` repository (a small INI reader with a CLI), its git history and ISSUE.md."""
import os
import subprocess
import textwrap


def w(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text).lstrip("\n"))


def commit(msg):
    subprocess.run(["git", "add", "-A"], check=True)
    subprocess.run(["git", "commit", "-q", "-m", msg], check=True)


w("ISSUE.md", """
    # iniq: values containing "=" are cut off

    With this file

        [db]
        url = postgres://db.internal/app?sslmode=require&connect_timeout=5

    `python3 -m iniq.cli app.ini db.url` prints `postgres://db.internal/app?sslmode`
    instead of the whole URL. Values may contain "=" (URLs, base64 padding); only the
    first "=" separates the key from the value. A line without a key (`= x`) should
    be an error, as a line without "=" already is.
    """)
os.makedirs("iniq", exist_ok=True)
os.chdir("iniq")
subprocess.run(["git", "init", "-q", "-b", "main"], check=True)
w("README.md", """
    # iniq
    Read INI files: `parse(text)` gives {section: {key: value}}, `get(cfg, "section.key")`
    looks a value up (with `get_int`, `get_bool`), and `python3 -m iniq.cli FILE KEY`
    prints one. Keys are case-insensitive. Lines starting with # or ; are comments.
    Run the tests with `python3 -m unittest discover -s tests -t .`
    """)
w("iniq/__init__.py", '__version__ = "0.4.0"\n')
w("iniq/parse.py", """
    class ParseError(ValueError):
        pass


    def parse(text):
        \"\"\"INI text -> {section: {key: value}}; keys before any section go to "".\"\"\"
        out = {"": {}}
        section = ""
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip().lower()
                out.setdefault(section, {})
                continue
            parts = line.split("=")
            if len(parts) < 2:
                raise ParseError("line %d: expected key = value" % n)
            key, value = parts[0], parts[1]
            out[section][key.strip().lower()] = value.strip()
        return out
    """)
w("tests/__init__.py", "")
w("tests/test_parse.py", """
    import unittest

    from iniq.parse import ParseError, parse


    class ParseTest(unittest.TestCase):
        def test_sections(self):
            cfg = parse("top = 1\\n[A]\\nx = 2\\n; c\\n# c\\n[b]\\nY=3\\n")
            self.assertEqual(cfg, {"": {"top": "1"}, "a": {"x": "2"}, "b": {"y": "3"}})

        def test_missing_equals(self):
            with self.assertRaises(ParseError):
                parse("[a]\\njust words\\n")
    """)
commit("parse: sections, keys, comments")
w("iniq/query.py", """
    TRUE = {"1", "yes", "true", "on"}
    FALSE = {"0", "no", "false", "off"}


    def get(cfg, dotted, default=None):
        section, _, key = dotted.rpartition(".")
        return cfg.get(section.lower(), {}).get(key.lower(), default)


    def get_int(cfg, dotted, default=None):
        v = get(cfg, dotted)
        return default if v is None else int(v)


    def get_bool(cfg, dotted, default=None):
        v = get(cfg, dotted)
        if v is None:
            return default
        if v.lower() in TRUE:
            return True
        if v.lower() in FALSE:
            return False
        raise ValueError("not a boolean: %r" % v)
    """)
w("tests/test_query.py", """
    import unittest

    from iniq.parse import parse
    from iniq.query import get, get_bool, get_int

    CFG = parse("name = x\\n[db]\\nport = 5432\\nssl = on\\n")


    class QueryTest(unittest.TestCase):
        def test_get(self):
            self.assertEqual(get(CFG, "name"), "x")
            self.assertEqual(get(CFG, "DB.Port"), "5432")
            self.assertIsNone(get(CFG, "db.user"))

        def test_typed(self):
            self.assertEqual(get_int(CFG, "db.port"), 5432)
            self.assertTrue(get_bool(CFG, "db.ssl"))
            self.assertEqual(get_int(CFG, "db.none", 7), 7)
    """)
commit("query: dotted lookups, int and bool getters")
w("iniq/cli.py", """
    import json
    import sys

    from .parse import parse
    from .query import get


    def main(argv):
        with open(argv[0]) as f:
            cfg = parse(f.read())
        if argv[1:] == ["--dump"]:
            print(json.dumps(cfg, indent=1, sort_keys=True))
            return 0
        value = get(cfg, argv[1])
        if value is None:
            print("no such key: %s" % argv[1], file=sys.stderr)
            return 1
        print(value)
        return 0


    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """)
w("tests/test_cli.py", """
    import contextlib
    import io
    import os
    import tempfile
    import unittest

    from iniq.cli import main


    class CliTest(unittest.TestCase):
        def test_get(self):
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "a.ini")
                with open(path, "w") as f:
                    f.write("[s]\\nk = v\\n")
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    self.assertEqual(main([path, "s.k"]), 0)
                self.assertEqual(out.getvalue(), "v\\n")
    """)
commit("cli: print a value or dump the file")
w("CHANGELOG.md", """
    # Changelog
    ## 0.4.0
    - cli
    ## 0.3.0
    - typed getters
    """)
commit("docs: changelog for 0.4.0")
subprocess.run(["git", "tag", "v0.4.0"], check=True)
print("created", os.getcwd())
'''


@traj
def mixed_swe_repair():
    t = Traj("mixed-swe-repair", "SWE-bench-shaped issue repair: explore a small repo, reproduce, fix, regression test, commit", "mixed")
    t.r("ls -la")
    t.write("setup_repo.py", SETUP_INIQ)
    t.sh("python3 setup_repo.py && rm setup_repo.py")
    t.r("cat ISSUE.md")
    T = "cd iniq && "
    for c in ["ls -la", "cat README.md", "git log --oneline --decorate", "git status --short | wc -l",
              "find . -path ./.git -prune -o -type f -print | sort", "wc -l iniq/*.py tests/*.py",
              "cat iniq/parse.py", "grep -rn 'split(' iniq/", "grep -rn 'parse(' iniq/ tests/",
              "cat iniq/cli.py", "sed -n '1,12p' iniq/query.py",
              "cat tests/test_parse.py", "python3 -m unittest discover -s tests -t . 2>&1 | tail -n 3"]:
        t.r(T + c)
    t.write("iniq/reproduce.py", """
        from iniq.parse import parse
        from iniq.query import get

        text = "[db]\\nurl = postgres://db.internal/app?sslmode=require&connect_timeout=5\\n"
        print(repr(get(parse(text), "db.url")))
        for bad in ("= x", "[s]\\n = y"):
            try:
                print(repr(parse(bad)))
            except ValueError as e:
                print("error:", e)
        """)
    t.r(T + "python3 reproduce.py")
    t.r(T + "python3 -c 'print(\"k = a=b=c\".split(\"=\"), \"k = a=b=c\".partition(\"=\"))'")
    for c in ["git log -p --follow -- iniq/parse.py | head -n 40", "git blame -L '/parts = /,+3' iniq/parse.py",
              "git log --format='%h %s' -- iniq/parse.py", "grep -rn 'ParseError' iniq/ tests/",
              "python3 -c 'from iniq.parse import parse; print(parse(\"a = 1\\n b = 2 \\n\"))'",
              "python3 -c 'from iniq.parse import parse; print(parse(\"[s]\\nk =\\n\"))'",
              "grep -n 'def test_' tests/*.py"]:
        t.r(T + c)
    # first fix: split at the first "=" only
    t.sh(T + "sed -i 's|^        parts = line.split(\"=\")$|        parts = line.split(\"=\", 1)|' iniq/parse.py && sed -n '/parts = /,/out\\[section\\]/p' iniq/parse.py")
    t.r(T + "python3 reproduce.py")
    t.r(T + "python3 -m unittest discover -s tests -t . 2>&1 | tail -n 3")
    # the empty key is still accepted: make it an error too
    t.r(T + "grep -n 'key, value' iniq/parse.py")
    t.sh(T + r"""sed -i 's|^        key, value = parts\[0\], parts\[1\]$|        key, value = parts[0].strip(), parts[1]\n        if not key:\n            raise ParseError("line %d: empty key" % n)|; s|^        out\[section\]\[key.strip().lower()\] = value.strip()$|        out[section][key.lower()] = value.strip()|' iniq/parse.py && sed -n '/parts = /,/return out/p' iniq/parse.py""")
    t.r(T + "python3 reproduce.py")
    t.r(T + "python3 -m unittest discover -s tests -t . -v 2>&1 | tail -n 12")
    t.r(T + "python3 -c 'from iniq.parse import parse; print(parse(\"[s]\\nk =\\nb64 = YWJj==\\n\"))'")
    t.r(T + "printf '[db]\\nurl = postgres://db.internal/app?sslmode=require&connect_timeout=5\\n' | python3 -c 'import sys; from iniq.parse import parse; print(parse(sys.stdin.read()))'")
    t.write("iniq/tests/test_parse.py", """
        import unittest

        from iniq.parse import ParseError, parse


        class ParseTest(unittest.TestCase):
            def test_sections(self):
                cfg = parse("top = 1\\n[A]\\nx = 2\\n; c\\n# c\\n[b]\\nY=3\\n")
                self.assertEqual(cfg, {"": {"top": "1"}, "a": {"x": "2"}, "b": {"y": "3"}})

            def test_missing_equals(self):
                with self.assertRaises(ParseError):
                    parse("[a]\\njust words\\n")

            def test_value_with_equals(self):
                cfg = parse("[db]\\nurl = pg://h/app?ssl=on&t=5\\nb64 = YWJj==\\n")
                self.assertEqual(cfg["db"], {"url": "pg://h/app?ssl=on&t=5", "b64": "YWJj=="})

            def test_empty_key(self):
                with self.assertRaises(ParseError):
                    parse("[a]\\n = x\\n")

            def test_empty_value(self):
                self.assertEqual(parse("k =\\n"), {"": {"k": ""}})
        """)
    t.r(T + "python3 -m unittest tests.test_parse -v 2>&1 | tail -n 9")
    t.r(T + "python3 -m unittest discover -s tests -t . 2>&1 | tail -n 3")
    t.write("app.ini", """
        ; service configuration
        name = billing
        [db]
        url = postgres://db.internal/app?sslmode=require&connect_timeout=5
        port = 5432
        ssl = yes
        [auth]
        token = c2VjcmV0==
        """)
    for c in ["python3 -m iniq.cli ../app.ini db.url", "python3 -m iniq.cli ../app.ini auth.token",
              "python3 -m iniq.cli ../app.ini --dump", "python3 -m iniq.cli ../app.ini db.user; echo \"exit=$?\"",
              "python3 -c 'from iniq.parse import parse; from iniq.query import get_bool, get_int; c = parse(open(\"../app.ini\").read()); print(get_int(c, \"db.port\"), get_bool(c, \"db.ssl\"))'",
              "git diff", "git diff --stat", "git status --short",
              "grep -rn 'split(\"=\")' iniq/ || echo none left", "sed -n '/def parse/,/return out/p' iniq/parse.py"]:
        t.r(T + c)
    t.sh(T + "rm reproduce.py && git status --short")
    t.sh(T + r"""sed -i 's|^## 0.4.0$|## unreleased\n- parse: keep "=" in values, reject empty keys\n## 0.4.0|' CHANGELOG.md && head -n 5 CHANGELOG.md""")
    t.r(T + "python3 -m unittest discover -s tests -t . 2>&1 | tail -n 1")
    t.sh(T + "git add -A && git commit -q -m 'parse: keep \"=\" in values, reject empty keys' && git log --oneline -3")
    for c in ["git show --stat HEAD", "git status --short | wc -l", "git log --oneline v0.4.0..HEAD",
              "git diff v0.4.0 --stat", "python3 -m iniq.cli ../app.ini db.url"]:
        t.r(T + c)
    t.verify = r"""
        set -e
        cd iniq
        python3 -m unittest discover -s tests -t . 2>&1 | tail -n 1 | grep -qx OK
        test "$(git rev-list --count HEAD)" = 5
        test -z "$(git status --porcelain)"
        test ! -e reproduce.py
        git log -1 --format=%s | grep -q 'keep "=" in values'
        test "$(python3 -m iniq.cli ../app.ini db.url)" = 'postgres://db.internal/app?sslmode=require&connect_timeout=5'
        python3 -c 'from iniq.parse import parse, ParseError
        try:
            parse("= x")
        except ParseError:
            pass
        else:
            raise SystemExit("empty key accepted")'
        grep -q test_value_with_equals tests/test_parse.py
        """
    t.volatile = ["iniq/.git/index", "iniq/.git/logs/**"]
    return t


# ====================================================================== main
def main():
    os.makedirs(OUT, exist_ok=True)
    names = set()
    rows = []
    for fn in REGISTRY:
        t = fn()
        assert t.name not in names, t.name
        names.add(t.name)
        assert 20 <= len(t.turns) <= 100, (t.name, len(t.turns))
        doc = t.doc()
        with open(os.path.join(OUT, t.name + ".json"), "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        ro = sum(t.ro) / len(t.turns)
        rows.append((t.category, t.name, len(t.turns), ro, t.title))
        if t.category == "read-heavy":
            assert ro >= 0.8, (t.name, ro)
    # keep the table in README.md between the markers up to date
    readme = os.path.join(OUT, "README.md")
    table = ["| name | category | turns | read-only | title |", "| --- | --- | --- | --- | --- |"]
    for cat, name, n, ro, title in rows:
        table.append("| %s | %s | %d | %d%% | %s |" % (name, cat, n, round(ro * 100), title))
    if os.path.exists(readme):
        text = open(readme).read()
        a, b = "<!-- table:begin -->\n", "<!-- table:end -->"
        if a in text and b in text:
            text = text[:text.index(a) + len(a)] + "\n".join(table) + "\n" + text[text.index(b):]
            with open(readme, "w") as f:
                f.write(text)
    for line in table:
        print(line)


if __name__ == "__main__":
    main()

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
        .venv/bin/pip list --disable-pip-version-check | grep -q 'textstats *1.1.0'
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
        .venv/bin/pip list --disable-pip-version-check | grep -q 'todofmt *1.1.0'
        .venv/bin/pip list --disable-pip-version-check | grep -q 'todocli *1.1.0'
        .venv/bin/python -m unittest discover -s tests -q
        """
    t.volatile = VENV_VOLATILE
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

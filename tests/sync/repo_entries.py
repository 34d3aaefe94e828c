"""GPUHUB_TUTORIAL_REPOS as organizers write it: copied from GitHub's "Code" button (HTTPS, SSH,
GitHub CLI), from the browser's address bar, with a token from a how-to, from a spreadsheet or
a chat, in an environment list with tabs and Windows line ends.

ACCEPTED: text -> the entries the reader makes of it (``Repo.entry()``: what the stack hands to
the sync service). REFUSED: text -> words its refusal must hold (the fix). No refusal may show
any of TOKENS.
"""

from __future__ import annotations

# Fakes in the formats of GitHub's classic and fine-grained tokens and GitLab's personal and
# deploy tokens: what would leak.
GHP = "ghp_TestOnlyNotARealToken0123456789abcd"
GITHUB_PAT = "github_pat_11TESTONLY0notarealtoken_0123456789abcdefABCDEF"
GLPAT = "glpat-TestOnly-NotReal-0123"
GLDT = "gldt-TestOnlyNotARealDeployToken01"
PASSWORD = "Winter2026!tutor"
TOKENS = (GHP, GITHUB_PAT, GLPAT, GLDT, PASSWORD)

G = "https://github.com/gpu-school/gpu101.git"

ACCEPTED = {
    "Code button, HTTPS": (f"gpu101={G}", [f"gpu101={G}#main"]),
    "browser address bar, no .git": (
        "gpu101=https://github.com/gpu-school/gpu101",
        ["gpu101=https://github.com/gpu-school/gpu101#main"],
    ),
    "trailing slash": (
        "gpu101=https://github.com/gpu-school/gpu101/",
        ["gpu101=https://github.com/gpu-school/gpu101#main"],
    ),
    ".git and a slash": (f"gpu101={G}/", [f"gpu101={G}#main"]),
    "upper-case name, scheme and host; the path's case kept": (
        "GPU101=HTTPS://GitHub.com/GPU-School/GPU101.git#Main",
        ["GPU101=https://github.com/GPU-School/GPU101.git#Main"],
    ),
    "a branch with a slash": (f"gpu101={G}#release/2026", [f"gpu101={G}#release/2026"]),
    "the branch as a ref": (f"gpu101={G}#refs/heads/dev", [f"gpu101={G}#dev"]),
    "webhook only": (f"gpu101={G}#main:webhook", [f"gpu101={G}#main:webhook"]),
    "webhook only, capitalised": (f"gpu101={G}#main:Webhook", [f"gpu101={G}#main:webhook"]),
    "webhook only on main": (f"gpu101={G}#:webhook", [f"gpu101={G}#main:webhook"]),
    "tabs, Windows line ends and blanks around the list": (
        f" \tgpu101={G}\r\n\tml=https://gitlab.com/gpu-school/ml-course.git\r\n",
        [f"gpu101={G}#main", "ml=https://gitlab.com/gpu-school/ml-course.git#main"],
    ),
    "a YAML block of one entry a line": (
        f"gpu101={G}#main\nml=https://gitlab.com/gpu-school/ml-course#2026\n",
        [f"gpu101={G}#main", "ml=https://gitlab.com/gpu-school/ml-course#2026"],
    ),
    "a no-break space between entries (a word processor's)": (
        f"gpu101={G}\u00a0ml=https://gitlab.com/gpu-school/ml-course.git",
        [f"gpu101={G}#main", "ml=https://gitlab.com/gpu-school/ml-course.git#main"],
    ),
    "a university's GitLab on its own port": (
        "lab=https://git.uni.example:8443/ws/lab.git",
        ["lab=https://git.uni.example:8443/ws/lab.git#main"],
    ),
    "a server on the workshop's network": (
        "lan=http://10.0.0.5:3000/org/lab.git",
        ["lan=http://10.0.0.5:3000/org/lab.git#main"],
    ),
    "git daemon": (
        "local=git://10.0.0.1/tutorials.git",
        ["local=git://10.0.0.1/tutorials.git#main"],
    ),
    "a mirror on the manager": (
        "mirror=file:///srv/mirrors/intro.git/",
        ["mirror=file:///srv/mirrors/intro.git#main"],
    ),
    "dots and underscores in the name": (
        f"intro_2026.v2={G}",
        [f"intro_2026.v2={G}#main"],
    ),
}

REFUSED = {
    # ---- credentials (class 1) ----
    "GitHub App / Actions form, x-access-token": (
        f"gpu101=https://x-access-token:{GHP}@github.com/gpu-school/gpu101.git",
        ["holds a credential", f"gpu101={G}", "GPUHUB_TUTORIAL_TOKEN_FILE"],
    ),
    "a classic token as the user": (
        f"gpu101=https://{GHP}@github.com/gpu-school/gpu101.git",
        ["holds a credential", f"gpu101={G}"],
    ),
    "a fine-grained token with the login": (
        f"gpu101=https://ada:{GITHUB_PAT}@github.com/gpu-school/gpu101.git#main",
        ["holds a credential", f"gpu101={G}"],
    ),
    "GitLab oauth2 form": (
        f"ml=https://oauth2:{GLPAT}@gitlab.com/gpu-school/ml-course.git",
        ["holds a credential", "ml=https://gitlab.com/gpu-school/ml-course.git"],
    ),
    "GitLab deploy token": (
        f"ml=https://gitlab+deploy-token-7:{GLDT}@gitlab.com/gpu-school/ml-course.git",
        ["holds a credential", "ml=https://gitlab.com/gpu-school/ml-course.git"],
    ),
    "user and password": (
        f"lab=https://tutor:{PASSWORD}@git.uni.example/ws/lab.git",
        ["holds a credential", "lab=https://git.uni.example/ws/lab.git"],
    ),
    "a token in the query": (
        f"ml=https://gitlab.com/gpu-school/ml-course.git?private_token={GLPAT}",
        ["holds a credential", "ml=https://gitlab.com/gpu-school/ml-course.git"],
    ),
    "credentials without a scheme": (
        f"gpu101=x-access-token:{GHP}@github.com/gpu-school/gpu101",
        ["holds a credential", "gpu101=https://github.com/gpu-school/gpu101.git"],
    ),
    "no name, a user and password without a scheme": (
        f"tutor:{PASSWORD}@git.uni.example/ws/lab.git",
        ["has no NAME"],
    ),
    # ---- SSH: the sync service has no key (class 2) ----
    "Code button, SSH": (
        "gpu101=git@github.com:gpu-school/gpu101.git",
        ["SSH URL", "no SSH key", f"gpu101={G}", "GPUHUB_TUTORIAL_TOKEN_FILE"],
    ),
    "ssh:// form": (
        "gpu101=ssh://git@github.com/gpu-school/gpu101.git#main",
        ["SSH URL", f"gpu101={G}"],
    ),
    "ssh:// with a port": (
        "lab=ssh://git@git.uni.example:2222/ws/lab.git",
        ["SSH URL", "lab=https://git.uni.example/ws/lab.git"],
    ),
    # ---- pasted commands and pages ----
    "Code button, GitHub CLI": (
        "gpu101=gh repo clone gpu-school/gpu101",
        ["is a command", f"gpu101={G}"],
    ),
    "GitHub CLI without a name": (
        "gh repo clone gpu-school/gpu101",
        ["is a command", f"gpu101={G}"],
    ),
    "a git clone command": (f"gpu101=git clone {G}", ["is a command", f"gpu101={G}"]),
    "a branch's page": (
        "gpu101=https://github.com/gpu-school/gpu101/tree/day-2",
        ["page of GitHub's website", f"gpu101={G}#day-2"],
    ),
    "a notebook's page": (
        "gpu101=https://github.com/gpu-school/gpu101/blob/main/01-intro.ipynb",
        ["page of GitHub's website", f"gpu101={G}"],
    ),
    "Download ZIP": (
        "gpu101=https://github.com/gpu-school/gpu101/archive/refs/heads/main.zip",
        ["page of GitHub's website", f"gpu101={G}"],
    ),
    "a GitLab page": (
        "ml=https://gitlab.com/gpu-school/ml-course/-/tree/main",
        ["page of a website", "ml=https://gitlab.com/gpu-school/ml-course.git"],
    ),
    "Open with GitHub Desktop": (
        "gpu101=x-github-client://openRepo/https://github.com/gpu-school/gpu101",
        ["not a git URL", "gpu101=https://github.com/gpu-school/gpu101"],
    ),
    "a query copied from the address bar": (f"gpu101={G}?tab=readme-ov-file", ["'?' part"]),
    "no scheme": ("gpu101=github.com/gpu-school/gpu101", ["not a URL", f"gpu101={G}"]),
    "OWNER/REPO only": ("gpu101=gpu-school/gpu101", ["not a URL", f"gpu101={G}"]),
    # ---- malformed entries ----
    "two tutorials with one name": (
        f"gpu101={G} gpu101=https://github.com/gpu-school/gpu101-extra.git",
        ["'gpu101' is given twice", "gpu101-2"],
    ),
    "two names differing in case": (
        f"gpu101={G} GPU101=https://github.com/gpu-school/gpu101-extra.git",
        ["'GPU101' is given twice, as 'gpu101' and 'GPU101' (case does not make two names)"],
    ),
    "no name": (G, ["has no NAME", f"gpu101={G}"]),
    "an empty name": (f"={G}", ["has no NAME", f"gpu101={G}"]),
    "no URL": ("gpu101=", ["has no URL"]),
    "blanks around =": (f"gpu101 = {G}", ["no blanks around '='", f"gpu101={G}"]),
    "a blank after =": (f"gpu101= {G}", ["no blanks around '='", f"gpu101={G}"]),
    "a blank in the name": (f"GPU 101={G}", ["a NAME has no blanks", f"GPU-101={G}"]),
    "commas between entries": (
        f"gpu101={G},ml=https://gitlab.com/gpu-school/ml-course.git",
        ["not commas", f"gpu101={G} ml=https://gitlab.com/gpu-school/ml-course.git"],
    ),
    "a comma and a blank (a spreadsheet's list)": (
        f"gpu101={G}, ml=https://gitlab.com/gpu-school/ml-course.git",
        ["not commas", f"gpu101={G}"],
    ),
    "semicolons (Excel in much of Europe)": (
        f"gpu101={G};ml=https://gitlab.com/gpu-school/ml-course.git",
        ["semicolons"],
    ),
    "quotes kept by an env file": (f'"gpu101={G}"', ["quotes are taken literally"]),
    "an unknown suffix": (f"gpu101={G}#main:webhok", ["only :webhook may follow"]),
    "poll is no suffix": (f"gpu101={G}#main:poll", ["only :webhook may follow"]),
    ":webhook without a branch": (f"gpu101={G}:webhook", [f"gpu101={G}#main:webhook"]),
    "a slash in the name": (f"gpu-school/gpu101={G}", ["not a plain folder name"]),
    "a hidden name": (f".gpu101={G}", ["not a plain folder name"]),
    "an accent in the name": (f"einführung={G}", ["not a plain folder name", "einf-hrung"]),
    "a zero-width space from a chat": (
        "gpu101=https://github.com/gpu-school/gpu\u200b101.git",
        ["U+200B (zero width space)"],
    ),
    "a branch git refuses": (f"gpu101={G}#day..2", ["not a branch name git accepts"]),
    "a commit id for a branch": (
        f"gpu101={G}#0123456789abcdef0123456789abcdef01234567",
        ["0123456789ab... is a commit id", "publishes a branch", f"gpu101={G}#main", "#NAME"],
    ),
    "pip's @version": (f"gpu101={G}@v1.0", ["after '@', as pip does", f"gpu101={G}#v1.0"]),
    "a port that is no number": ("lab=https://git.uni.example:x/ws/lab.git", ["no number"]),
}

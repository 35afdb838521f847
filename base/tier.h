/* tier.h - which storage tier served a read, as far as the reader can tell.
 * Page sources (engine/) report it, jlmfs views (fs/) serve it, the residency
 * database (residency/) counts reads per tier. The values are stored in that
 * database: never renumber them. */
#ifndef JLM_TIER_H
#define JLM_TIER_H

enum jlm_tier {
    JLM_TIER_UNKNOWN = 0,   /* buffered file: page cache or disk, not known */
    JLM_TIER_FRAME = 1,     /* already in an engine frame (pager hits) */
    JLM_TIER_PAGECACHE = 2, /* the kernel's page cache */
    JLM_TIER_DISK = 3,      /* O_DIRECT: the device */
    JLM_TIER_CONVERT = 4,   /* packed on demand by a jlmfs view */
    JLM_TIER_MEMORY = 5,    /* a memory source */
};

#endif

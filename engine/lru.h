/* lru.h - the page-replacement policy of the device backends' frames
 * (backend_vk.c, backend_cu.c through devframes.c; the host pager's whole-frame policy before partial frames,
 * docs/pager.md): one recency list per
 * eviction class, most recently used at the head, and the victim rule of
 * pager.h's invariant (7): the least recently used unpinned EXPERT-class
 * page first, else the MOST recently used unpinned BLOCK-class page.
 *
 * A page record embeds a jlm_lru_node (the caller maps a node back to its
 * record; put it first). Only unpinned resident pages are listed.
 * Header-only, no allocation, cannot fail; one thread (the engine's). */
#ifndef JLM_ENGINE_LRU_H
#define JLM_ENGINE_LRU_H

#include <stddef.h>
#include <stdint.h>

typedef struct jlm_lru_node {
    struct jlm_lru_node *prev, *next;
} jlm_lru_node;

typedef struct jlm_lru {
    jlm_lru_node *head, *tail;
    uint32_t      n;
} jlm_lru;

static inline void jlm_lru_unlink(jlm_lru *l, jlm_lru_node *x)
{
    if (x->prev) x->prev->next = x->next; else l->head = x->next;
    if (x->next) x->next->prev = x->prev; else l->tail = x->prev;
    x->prev = x->next = NULL;
    l->n--;
}

/* x becomes the most recently used of its list. */
static inline void jlm_lru_push_head(jlm_lru *l, jlm_lru_node *x)
{
    x->prev = NULL;
    x->next = l->head;
    if (l->head) l->head->prev = x; else l->tail = x;
    l->head = x;
    l->n++;
}

/* Invariant (7): lists[1] is the EXPERT class (LRU victim: the tail),
 * lists[0] the BLOCK class (MRU victim: the head). NULL if both are empty. */
static inline jlm_lru_node *jlm_lru_victim(const jlm_lru lists[2])
{
    return lists[1].tail ? lists[1].tail : lists[0].head;
}

#endif

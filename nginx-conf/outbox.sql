-- The outbox of events.conf: each row is an event of a channel, and its
-- trigger announces it with its id as the payload's first word (the id
-- of the event the page shows, and where a client that comes back
-- resumes).
create table outbox (
    id      bigserial primary key,
    channel text not null,
    data    text not null,
    at      timestamptz not null default now()
);
create function outbox_notify() returns trigger language plpgsql as $$
begin
    perform pg_notify(new.channel, new.id || ' ' || new.data);
    return new;
end $$;
create trigger outbox_notify after insert on outbox for each row execute function outbox_notify();

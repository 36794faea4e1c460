-- The worked example of sqldb_jwt_key (nginx-conf/jwt.conf), run by
-- `make run` as the superuser. Requests with a token run as the role of
-- its "role" claim; requests without one as notes_anon. The login role
-- of the gateway ("demo") must be a member of each role it switches to.
create role notes_anon nologin;
create role notes_user nologin;
grant notes_anon, notes_user to demo;
-- The table belongs to a role of its own, not to the login role, and the
-- login role does not inherit the rights of the roles it may switch to: a
-- token that names "demo" gets demo's own rights, none on the notes.
create role notes_owner nologin;
alter role demo noinherit;

create table notes (
    id serial primary key,
    owner text not null default current_setting('request.jwt.claims', true)::json->>'sub',
    body text not null,
    public boolean not null default false
);
alter table notes owner to notes_owner;
insert into notes (owner, body, public) values
    ('alice', 'alice''s shopping list', false),
    ('alice', 'alice''s public note', true),
    ('bob', 'bob''s diary', false);

-- Row-level security: a user sees and writes their own notes (the "sub"
-- claim); anonymous requests see the public ones.
alter table notes enable row level security;
create policy own_notes on notes to notes_user
    using (owner = current_setting('request.jwt.claims', true)::json->>'sub')
    with check (owner = current_setting('request.jwt.claims', true)::json->>'sub');
create policy public_notes on notes for select to notes_anon using (public);
grant select, insert, delete on notes to notes_user;
grant usage on sequence notes_id_seq to notes_user;
grant select on notes to notes_anon;

-- The demo's sample schema.
create table cats (
    id     serial primary key,
    name   text not null,
    age    int,
    indoor boolean
);
insert into cats (name, age, indoor) values ('Tom', 3, true), ('Bob', 7, false), ('Jerry', null, null);
